"""The store server's boot: which life of the server this is, counted in a state file so it never repeats.

A restarted server is empty, and the job's processes come back to it in any order. The epoch of the new life
must not depend on which of them comes first (one that knew nothing, or one paused through a whole life, would
write an epoch already used). So the server counts its own lives: at start it takes the number after the one in
its state file (under an exclusive lock, written atomically) and publishes "boot:nonce" under BOOT_KEY. A server
without a state file publishes boot 0 every time; a job on it then falls back to the epoch its first returning
process proposes (ftcoord.store.link), which holds only while that process knew the newest epoch.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from ftcoord.errors import ConfigError

BOOT_KEY = "ftcoord-server/boot"
"""The base key (no job's prefix) that holds the server's "boot:nonce" (stateless: "0:nonce:stateless")."""
STATELESS = "stateless"


@dataclass(frozen=True)
class Boot:
    """One life of a store server: its number, a nonce, and whether a state file counts the lives."""

    number: int
    nonce: str
    counted: bool

    @classmethod
    def parse(cls, raw: bytes | str) -> Boot:
        """A BOOT_KEY value, as `str(boot)` wrote it."""
        text = raw.decode() if isinstance(raw, bytes) else raw
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit() or (len(parts) == 3 and parts[2] != STATELESS):
            raise ConfigError(f"the store's {BOOT_KEY} holds {text!r}, not 'boot:nonce'; is it an ftcoord-store?")
        return cls(int(parts[0]), parts[1], len(parts) == 2)

    def __str__(self) -> str:
        return f"{self.number}:{self.nonce}" if self.counted else f"{self.number}:{self.nonce}:{STATELESS}"


def default_state_file(host: str, port: int) -> Path:
    """Where `ftcoord-store` counts its lives unless told: $XDG_STATE_HOME (~/.local/state)/ftcoord/, one file per
    address, so a server started again on the same address continues the count.

    Args:
        host: the interface the server listens on.
        port: the port it listens on (the one picked, when asked for 0).
    """
    root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return root / "ftcoord" / f"store-{host.strip('[]').replace(':', '_')}-{port}.boot"


def next_boot(state_file: Path | None) -> Boot:
    """The boot of a server starting now: one more than the state file says (0 when it does not exist yet), written
    back before it is returned; boot 0, not counted, without a state file.

    Args:
        state_file: the file that counts the server's lives; None: none is kept.

    Raises:
        ConfigError: the file holds something else than a number, or cannot be written (the path, what to do).
    """
    nonce = secrets.token_hex(6)
    if state_file is None:
        return Boot(0, nonce, False)
    try:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        with open(state_file.with_name(state_file.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            text = state_file.read_text().strip() if state_file.exists() else None
            if text is not None and not text.isdigit():
                raise ConfigError(f"the store's state file {state_file} holds {text[:40]!r}, not a boot number; "
                                  f"restore it, or pass another --state-file (a new file starts the count at 0, "
                                  f"and jobs that were running must be started anew)")
            number = int(text) + 1 if text is not None else 0
            temporary = state_file.with_name(state_file.name + ".tmp")
            with open(temporary, "w") as out:
                out.write(f"{number}\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, state_file)
    except OSError as exc:
        raise ConfigError(f"cannot keep the store's state file {state_file}: {exc.strerror}; pass a --state-file "
                          f"in a writable directory, or --no-state") from exc
    return Boot(number, nonce, True)
