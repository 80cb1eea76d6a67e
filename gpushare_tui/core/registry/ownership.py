"""An engine owned by `gpushare-tui up`: what its status reports about the owner, and how a
stop asked on its control socket (the dashboard's `s`) reaches the owner, which then does not
restart it.

`up` starts each engine process (`run` supervisor or `synth`) with ENV set to one JSON object
`{"config": FILE, "pid": UP_PID, "weight": FILE_WEIGHT, "restarts": N, "fd": FD}`; FD is the
write end of a pipe to `up`, on which a requested stop writes `stop\\n` before the engine ends.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

ENV = "GPUSHARE_UP_OWNER"
STOP_EVENT = b"stop\n"


@dataclass
class Owner:
    config: str
    pid: int
    config_weight: float
    restarts: int = 0
    fd: int | None = None

    @classmethod
    def from_env(cls) -> Owner | None:
        """The owner `up` declared in our environment (removed from it: the engine does not
        inherit it), or None when there is none or it is malformed."""
        raw = os.environ.pop(ENV, None)
        if not raw:
            return None
        try:
            d = json.loads(raw)
            fd = d.get("fd")
            if fd is not None:
                os.fstat(fd)
                os.set_inheritable(fd, False)
            w = float(d["weight"])
            if not math.isfinite(w):
                return None
            return cls(str(d["config"]), int(d["pid"]), w, int(d.get("restarts", 0)), fd)
        except (ValueError, TypeError, KeyError, OSError, AttributeError):
            return None

    def to_env(self) -> str:
        return json.dumps(
            {
                "config": self.config,
                "pid": self.pid,
                "weight": self.config_weight,
                "restarts": self.restarts,
                "fd": self.fd,
            }
        )

    def status_fields(self) -> dict:
        """The StatusReply fields that describe the owner."""
        return {
            "owner": "up",
            "owner_pid": self.pid,
            "config": self.config,
            "config_weight": self.config_weight,
            "restarts": self.restarts,
        }

    def wrap(self, handlers: dict) -> dict:
        """Control handlers with `stop` reported to the owner first, and `set_weight` taking
        `"config": true` from the owner (a reload: the file's weight changed too)."""
        stop, set_weight = handlers["stop"], handlers["set_weight"]

        def owned_stop(req: dict) -> dict:
            if self.fd is not None:
                try:
                    os.write(self.fd, STOP_EVENT)
                except OSError:
                    pass  # the owner is gone: nobody will restart us anyway
            return stop(req)

        def owned_set_weight(req: dict) -> dict:
            reply = set_weight(req)
            if req.get("config") is True:
                self.config_weight = float(reply["weight"])
            return reply

        return {**handlers, "stop": owned_stop, "set_weight": owned_set_weight}
