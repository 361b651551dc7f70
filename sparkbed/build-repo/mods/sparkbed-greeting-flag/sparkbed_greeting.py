"""
sparkbed-greeting-flag: ``vllm serve --sparkbed-greeting TEXT``, a flag this image's vLLM does not have.

Imported at every python3 start (``sparkbed_greeting.pth`` in the site folder), it imports nothing of
vLLM: an import hook waits for the module that holds vLLM's serve argument parser
(``make_arg_parser``) and wraps it once that module has run, before anything can import the name
from it, so every parser vLLM builds for ``vllm serve`` (the CLI, the in-image validation) takes the
flag. ``vllm serve`` started with it logs ``sparkbed greeting: TEXT`` once.
"""

import functools
import sys

FLAG = "--sparkbed-greeting"
# Where vLLM keeps make_arg_parser, newest first (as sparkinfra's vllm_check.py looks for it).
PARSER_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                  "vllm.entrypoints.openai.cli_args")
SERVE_MODULE = "vllm.entrypoints.cli.serve"


def _add_flag(make_arg_parser):
    if getattr(make_arg_parser, "sparkbed_greeting", False):
        return make_arg_parser

    @functools.wraps(make_arg_parser)
    def wrapped(parser, *args, **kwargs):
        parser = make_arg_parser(parser, *args, **kwargs)
        if FLAG not in parser._option_string_actions:
            parser.add_argument(FLAG, metavar="TEXT", default=None,
                                help="sparkbed-greeting-flag mod: a line the server logs at start")
        return parser

    wrapped.sparkbed_greeting = True
    return wrapped


def _greet(cmd):
    if getattr(cmd, "sparkbed_greeting", False):
        return cmd

    @functools.wraps(cmd)
    def wrapped(args, *rest, **kwargs):
        text = getattr(args, "sparkbed_greeting", None)
        if text is not None:
            print(f"sparkbed greeting: {text}", file=sys.stderr, flush=True)
        return cmd(args, *rest, **kwargs)

    wrapped.sparkbed_greeting = True
    return wrapped


def _patch(module) -> None:
    if module.__name__ == SERVE_MODULE:
        command = getattr(module, "ServeSubcommand", None)
        if command is not None and "cmd" in vars(command):
            command.cmd = staticmethod(_greet(command.cmd))
    elif hasattr(module, "make_arg_parser"):
        module.make_arg_parser = _add_flag(module.make_arg_parser)


class _Loader:
    """The module's own loader, patching the module once it has run."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _Finder:
    """Finds the watched modules as the rest of ``sys.meta_path`` would, with a patching loader."""

    def find_spec(self, name, path, target=None):
        if name not in PARSER_MODULES and name != SERVE_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return
    for name in (*PARSER_MODULES, SERVE_MODULE):
        if name in sys.modules:
            _patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())


install()
