"""The training engine: the recipe, producer, queue, trainer, packing, RL maths and backends."""
