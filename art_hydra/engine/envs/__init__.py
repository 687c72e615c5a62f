"""Multi-turn rollouts: environments and tools in TRL's shapes, tool-call parsers, the
chat template's tool turns, and the loop that samples, calls tools and samples again."""
