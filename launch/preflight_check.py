"""One start-up check's result: the key, passed or failed (or not checked here), and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    key: str
    ok: bool | None
    """None: not checked here (``detail`` says where it is)."""
    detail: str

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[self.ok]
        return f"{mark} {self.key}: {self.detail}"
