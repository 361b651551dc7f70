"""
Runs where vLLM is installed (the controller, or a lane's image; stdlib + vLLM only, any vLLM
version): checks ``vllm serve`` argument lists with that vLLM's own parser.

    python3 vllm_check.py < request.json

A request is ``{"ranks": [[arg, ...], ...], "engine": bool, "strip": ["--flag", ...]}`` (stdin may
hold one request or a list of them). Each rank's arguments (model first, as after ``vllm serve``)
go through the serve argument parser, ``validate_parsed_serve_args``, the reasoning and tool-call
parser registries and, with ``engine``, ``AsyncEngineArgs.from_cli_args(ns).create_engine_config()``
(which reads the model's config and tokenizer). Flags in ``strip`` are removed first, with their
values: flags only the lane's own image build knows. An empty argument list (a Ray worker) is skipped.

A request's ``rules`` (the shipped image rules, as ``rule_eval`` reads them) are judged on the
image's facts (``image_facts``: read here, with this process's environment, a rank's): a refusal
fails the result with what it says, a warning goes to the result's ``warnings``.

The last line of stdout is one JSON result per request (a list for a list):
``{"ok": bool, "vllm": version, "rank": r or null, "error": vLLM's message or null, "stripped": [...]}``
(and ``warnings``, when a rule warns). vLLM's own output goes to stderr.
"""

import contextlib
import importlib
import inspect
import io
import json
import os
import re
import sys

try:
    from . import rule_eval  # run from the node programs (the head's in-image check)
except ImportError:
    import rule_eval  # run as a file beside it (the controller's check)

# Where vLLM keeps its serve argument parser, newest first.
PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",  # 0.33
    "vllm.entrypoints.launchers.cli_args",  # 0.32
    "vllm.entrypoints.openai.cli_args",  # before
)
ARGPARSE_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")
TOOL_PARSER_MODULES = ("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
REASONING_PARSER_MODULES = ("vllm.reasoning", "vllm.entrypoints.openai.reasoning_parsers")


def _find(modules, name):
    """``name`` from the first of ``modules`` that has it, else None."""
    for module in modules:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):  # not this vLLM's layout: the next
                continue
            raise  # vLLM itself (or a plugin it loads) fails to import: that is the reason to show
        if found is not None:
            return found
    return None


def _message(exc):
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{type(exc).__name__}: {text}"[:4000]


def _flag_name(token):
    return token.split("=", 1)[0].replace("_", "-")


def strip_flags(args, flags):
    """``args`` without ``flags`` (and ``--no-`` forms) and their values; and the flags removed."""
    names = set()
    for flag in flags:
        name = _flag_name(flag)
        names.add(name)
        if name.startswith("--"):
            names.add("--no-" + name[2:])
    kept, removed = [], set()
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        name = _flag_name(token)
        if token.startswith("-") and name in names:
            removed.add(name)
            if "=" not in token:
                # its values: what follows up to the next flag (a negative number is a value)
                while i < len(args) and not re.match(r"-[A-Za-z-]", args[i]):
                    i += 1
            continue
        kept.append(token)
    return kept, sorted(removed)


def _registered(manager):
    if manager is None:
        return set()
    if hasattr(manager, "list_registered"):
        return set(manager.list_registered())
    names = set()
    for attr in ("tool_parsers", "reasoning_parsers", "lazy_parsers"):
        names |= set(getattr(manager, attr, None) or {})
    return names


def check_parser_names(ns):
    """Reasoning and tool-call parser names against vLLM's registries (vLLM checks them only at start)."""
    tool = getattr(ns, "tool_call_parser", None)
    if tool and not getattr(ns, "tool_parser_plugin", None):
        names = _registered(_find(TOOL_PARSER_MODULES, "ToolParserManager"))
        if names and tool not in names:
            raise KeyError(f"invalid tool call parser: {tool} (chose from {{ {','.join(sorted(names))} }})")
    reasoning = getattr(ns, "reasoning_parser", None) or getattr(
        getattr(ns, "structured_outputs_config", None), "reasoning_parser", None
    )
    if reasoning and not getattr(ns, "reasoning_parser_plugin", None):
        names = _registered(_find(REASONING_PARSER_MODULES, "ReasoningParserManager"))
        if names and reasoning not in names:
            raise KeyError(f"invalid reasoning parser: {reasoning} (chose from {{ {','.join(sorted(names))} }})")


class Checker:
    """The installed vLLM's serve parser and checks, built once."""

    def __init__(self, engine):
        import vllm

        self.version = getattr(vllm, "__version__", "?")
        if not engine:
            _cpu_platform_if_unknown()
        make_arg_parser = _find(PARSER_MODULES, "make_arg_parser")
        parser_class = _find(ARGPARSE_MODULES, "FlexibleArgumentParser")
        if make_arg_parser is None or parser_class is None:
            raise ImportError(f"no serve argument parser found in vLLM {self.version}")
        self.parser = make_arg_parser(parser_class(prog="vllm serve"))
        self.validate = _find(PARSER_MODULES, "validate_parsed_serve_args")

    def parse(self, args):
        """(namespace, None) or (None, argparse's message)."""
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = self.parser.parse_args(list(args))
        except SystemExit:
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            return None, lines[-1] if lines else "argument parsing failed"
        except Exception as exc:  # FlexibleArgumentParser raises some errors itself
            return None, _message(exc)
        if getattr(ns, "model_tag", None):  # as `vllm serve` does
            ns.model = ns.model_tag
        return ns, None

    def check(self, args, engine):
        """None, or vLLM's message about ``args``."""
        ns, error = self.parse(args)
        if error:
            return error
        try:
            if self.validate is not None:
                self.validate(ns)
            check_parser_names(ns)
            if engine:
                from vllm.engine.arg_utils import AsyncEngineArgs

                engine_args = AsyncEngineArgs.from_cli_args(ns)
                kwargs = {}
                if "headless" in inspect.signature(engine_args.create_engine_config).parameters:
                    kwargs["headless"] = bool(getattr(ns, "headless", False))
                engine_args.create_engine_config(**kwargs)
        except Exception as exc:
            return _message(exc)
        return None


def _cpu_platform_if_unknown():
    """Parsing needs a platform; without a GPU (a check before serving) use CPU, as ``vllm bench`` does."""
    from vllm import platforms

    current = platforms.current_platform
    if getattr(current, "is_unspecified", lambda: False)():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


def run(requests):
    try:
        checker = Checker(engine=any(r.get("engine") for r in requests))
    except Exception as exc:
        error = f"vLLM import failed: {_message(exc)}"
        return [{"ok": False, "vllm": None, "rank": None, "error": error, "stripped": []} for _ in requests]
    results = []
    for request in requests:
        result = {"ok": True, "vllm": checker.version, "rank": None, "error": None, "stripped": []}
        removed = set()
        saved = {key: os.environ.get(key) for key in request.get("env", {})}
        os.environ.update(request.get("env", {}))  # the lane's VLLM_* settings, as its container has them
        for rank, args in enumerate(request.get("ranks", [])):
            if not args:
                continue
            args, gone = strip_flags(args, request.get("strip", []))
            removed.update(gone)
            error = checker.check(args, bool(request.get("engine")))
            if error:
                result.update(ok=False, rank=rank, error=error)
                break
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        result["stripped"] = sorted(removed)
        results.append(result)
    return results


# NCCL's configuration files, in the order it reads them: a variable is set from the first that
# has it, and never over the environment (its initEnv: setenv without overwrite).
def _conf_files(env) -> list[str]:
    user = env.get("NCCL_CONF_FILE") or os.path.join(env.get("HOME") or "/root", ".nccl.conf")
    return [user, "/etc/nccl.conf"]


def image_facts(env=None) -> dict:
    """The facts an image rule reads (``sparkinfra.rules``), here in the lane's image with a rank's
    environment: ``nccl_conf_applies``, what NCCL's configuration files set that the environment
    does not ("NAME=VALUE (FILE)", comma-separated; "" when nothing)."""
    env = os.environ if env is None else env
    applies, seen = [], set()
    for path in _conf_files(env):
        try:
            lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
        except OSError:
            continue
        for line in lines:
            name, equals, value = line.strip().partition("=")
            name = name.strip()
            if not equals or name.startswith("#") or not name or name in env or name in seen:
                continue
            seen.add(name)
            applies.append(f"{name}={value.strip()} ({path})")
    return {"nccl_conf_applies": ", ".join(applies)}


def judged(result: dict, rules: list, facts: dict) -> dict:
    """``result`` with the image ``rules`` that ``facts`` trip: a refusal fails it (after vLLM's own
    verdict, which stays first), a warning is kept in its ``warnings``."""
    for rule in rules:
        if not rule_eval.trips(rule, facts):
            continue
        said = rule_eval.said(rule, facts)
        if rule["severity"] == "refuse" and result["ok"]:
            result.update(ok=False, rank=None, error=said)
        elif rule["severity"] != "refuse":
            result.setdefault("warnings", []).append(said)
    return result


def main():
    data = json.load(sys.stdin)
    requests = data if isinstance(data, list) else [data]
    with contextlib.redirect_stdout(sys.stderr):  # vLLM logs to stdout
        results = run(requests)
    if any(r.get("rules") for r in requests):
        facts = image_facts()
        results = [judged(result, r.get("rules") or [], facts) for r, result in zip(requests, results)]
    print(json.dumps(results if isinstance(data, list) else results[0]))


if __name__ == "__main__":
    main()
