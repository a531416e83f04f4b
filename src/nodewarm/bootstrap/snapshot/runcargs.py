"""A runc command line, as containerd's runc shim writes it: global options, the command, its options, the id.

The runtime handler stands where runc stands, so it must pass every call through unchanged and rewrite only a
``create`` into a ``restore``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

# runc's global options that take a value (runc 1.1's `runc --help`); the rest are switches.
_GLOBAL_VALUED = frozenset({"--log", "--log-format", "--root", "--criu", "--rootless"})
# `runc create` options that take a value.
_CREATE_VALUED = frozenset({"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"})


@dataclass(frozen=True)
class RuncCall:
    global_args: tuple[str, ...]
    command: str                     # "" when the line has none (`runc --version`)
    args: tuple[str, ...]            # after the command, the container id included

    @property
    def container_id(self) -> str:
        return self.args[-1] if self.args and not self.args[-1].startswith("-") else ""

    def option(self, *names: str) -> str:
        """The value of a command option, in either spelling (``--bundle B`` or ``--bundle=B``); "" when absent."""
        for i, a in enumerate(self.args):
            for n in names:
                if a == n and i + 1 < len(self.args):
                    return self.args[i + 1]
                if a.startswith(n + "="):
                    return a[len(n) + 1:]
        return ""

    def global_option(self, name: str) -> str:
        for i, a in enumerate(self.global_args):
            if a == name and i + 1 < len(self.global_args):
                return self.global_args[i + 1]
            if a.startswith(name + "="):
                return a[len(name) + 1:]
        return ""


def parse(argv: list[str] | tuple[str, ...]) -> RuncCall:
    """``argv`` without the program name."""
    argv = tuple(argv)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in _GLOBAL_VALUED else 1
    return RuncCall(global_args=argv[:i], command=argv[i] if i < len(argv) else "", args=argv[i + 1:])


def restore_argv(create: RuncCall, image_path: str, work_path: str) -> list[str]:
    """The ``runc restore`` that stands for ``create``: same globals, bundle, pid file and console; detached, so
    the shim sees a running container whose ``start`` the handler then answers itself."""
    if create.command != "create" or not create.container_id:
        raise ValueError(f"not a runc create: {create}")
    out = list(create.global_args) + ["restore", "--detach", "--image-path", image_path, "--work-path", work_path]
    for name in ("--bundle", "--pid-file", "--console-socket"):
        value = create.option(name, "-b") if name == "--bundle" else create.option(name)
        if value:
            out += [name, value]
    for switch in ("--no-pivot", "--no-new-keyring"):
        if switch in create.args:
            out.append(switch)
    out.append(create.container_id)
    return out
