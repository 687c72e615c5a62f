"""A hub id the local cache lacks: whether the run may download it (``HF_HUB_OFFLINE``,
else a short probe of the hub or the proxy) and the problem that says which, so a model
that cannot arrive is named before the run rather than failing a minute into it.

The probe opens one TCP connection, nothing more: the pre-flight sends no request to any
host, and a sweep's points share its verdict.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from art_hydra import model_files
from art_hydra.config.problems import Problem, fix
from art_hydra.preflight.common import world_problem

#: Values of HF_HUB_OFFLINE that explicitly allow downloading.
_ONLINE = ("0", "false", "no", "off")


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def downloads_allowed() -> bool:
    """Whether the run may download a model the cache lacks: ``HF_HUB_OFFLINE=0`` says so
    outright; unset, the hub must answer a connection now (:func:`hub_reachable`), else
    the load would fail a minute later, after retries, with a traceback."""
    if _offline():
        return False
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in _ONLINE:
        return True
    return hub_reachable()


#: The probe's verdict per (host, port): a sweep's thousand points connect once.
_reachable: dict[tuple[str, int], bool] = {}
#: Seconds the probe waits for a connection (DNS lookup included).
PROBE_S = 3.0


def hub_address() -> tuple[str, int]:
    """Where a download would connect first: the HTTPS proxy when one is set, else the
    hub endpoint (``HF_ENDPOINT``, default huggingface.co)."""
    from urllib.parse import urlsplit

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    default = 443 if url.scheme == "https" else 80
    return url.hostname or "huggingface.co", url.port or default


def hub_reachable() -> bool:
    """Whether a TCP connection to the hub (or the proxy) opens within ``PROBE_S``; the
    lookup and connection run in a daemon thread, so a hanging resolver cannot hold the
    pre-flight longer than that."""
    import socket
    import threading

    address = hub_address()
    if address not in _reachable:
        verdict: list[bool] = []

        def connect() -> None:
            try:
                socket.create_connection(address, timeout=PROBE_S).close()
                verdict.append(True)
            except OSError:
                verdict.append(False)

        probe = threading.Thread(target=connect, name="hub-probe", daemon=True)
        probe.start()
        probe.join(PROBE_S)
        _reachable[address] = bool(verdict and verdict[0])
    return _reachable[address]


def download_command(name: str, revision: str | None) -> str:
    return f"hf download {name}" + (f" --revision {revision}" if revision else "")


def uncached_problems(cfg: DictConfig, name: str) -> list[Problem]:
    """Hub id ``name`` is not in the cache: a warning when the run may download it (its
    files are then checked only once loaded), else an error with the command that
    fetches it where the hub is reachable."""
    revision = cfg.model.revision
    cache = model_files.hub_cache()
    at = f" at revision {revision}" if revision else ""
    command = download_command(name, revision)
    if downloads_allowed():
        return [
            world_problem(
                "model.name",
                name,
                f"is not in the Hugging Face cache ({cache}){at}; the run will download it, "
                "so its files, tokenizer and lengths are checked only once it has loaded.",
                fix(note=f"{command} first, to have everything checked before the run"),
                warning=True,
            )
        ]
    host, port = hub_address()
    why = (
        "HF_HUB_OFFLINE is set, so it cannot be downloaded"
        if _offline()
        else f"the hub ({host}:{port}) does not answer from here, so it cannot be downloaded "
        "(the load would fail a minute later, after its retries)"
    )
    return [
        world_problem(
            "model.name",
            name,
            f"is not in the Hugging Face cache ({cache}){at}: {why}.",
            fix(
                note=f"{command} (or huggingface-cli download {name}) where the hub is "
                "reachable, into this cache, then run again"
            ),
        )
    ]
