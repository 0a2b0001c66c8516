"""Turn a `vllm serve` command line that uses the removed speculative flags into one that uses a
single `--speculative-config` JSON, plus the matching specdeploy host data."""

from __future__ import annotations

import json
import pprint
import shlex
from dataclasses import dataclass

from specdeploy.config.schema import ServeConfig
from specdeploy.render.argv import (
    LEGACY_BOOLEAN_FLAGS,
    LEGACY_SPECULATIVE_FLAGS,
    MANAGED_FLAGS,
    SHORT_SPECULATIVE_FLAGS,
    speculative_json,
)


class MigrationError(ValueError):
    pass


@dataclass
class Migration:
    command: list[str]
    speculative_config: dict
    host_data: dict
    notes: list[str]

    def shell(self) -> str:
        return shlex.join(self.command)


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def migrate(argv: list[str]) -> Migration:
    if len(argv) < 3 or argv[1] != "serve":
        raise MigrationError(
            "expected a command of the form: vllm serve MODEL [FLAGS...] — give it after --, "
            "e.g. specdeploy migrate -- vllm serve Qwen/Qwen3-8B --speculative-model "
            "Qwen/Qwen3-0.6B --num-speculative-tokens 5"
        )
    head, rest = argv[:2], argv[2:]
    legacy: dict = {}
    kept: list[str] = []
    has_json = False
    model = None
    notes: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        flag, inline = (arg.split("=", 1) + [None])[:2] if arg.startswith("--") else (arg, None)
        if flag in LEGACY_SPECULATIVE_FLAGS or flag in SHORT_SPECULATIVE_FLAGS:
            key = LEGACY_SPECULATIVE_FLAGS.get(flag) or SHORT_SPECULATIVE_FLAGS[flag]
            if flag in LEGACY_BOOLEAN_FLAGS and inline is None:
                legacy[key] = True
                i += 1
                continue
            if inline is None:
                if i + 1 >= len(rest):
                    raise MigrationError(f"{flag} needs a value — give it as {flag} VALUE")
                inline = rest[i + 1]
                i += 1
            legacy[key] = _value(inline)
        elif flag in ("--speculative-config", "-sc"):
            has_json = True
            kept.append(arg)
            if inline is None and i + 1 < len(rest):
                kept.append(rest[i + 1])
                i += 1
        elif flag == "--model":
            model = inline if inline is not None else rest[i + 1]
            i += 0 if inline is not None else 1
        elif model is None and not arg.startswith("-"):
            model = arg
        else:
            kept.append(arg)
        i += 1
    if has_json and legacy:
        raise MigrationError(
            "the command mixes --speculative-config with the old flags "
            f"({', '.join(sorted(legacy))}); keep one style — put every setting in the JSON"
        )
    if not legacy:
        raise MigrationError(
            "nothing to migrate: no --speculative-model/--num-speculative-tokens style flags — a "
            "--speculative-config JSON goes into host data as it is, as speculative_config"
        )
    if model is None:
        raise MigrationError(
            "no target model found — give it after serve (vllm serve MODEL ...) or as --model"
        )
    spec = dict(legacy)
    if "method" not in spec:
        if spec.get("model") in ("[ngram]", "ngram"):
            spec.pop("model")
            spec["method"] = "ngram"
        else:
            spec["method"] = "draft_model"
            notes.append(
                'method set to "draft_model" (a separate draft model); use "eagle"/"eagle3" '
                "if the draft is an EAGLE head"
            )
    if "acceptance_method" in spec or "posterior_threshold" in spec or "posterior_alpha" in spec:
        notes.append(
            "typical acceptance sampling is gone from vLLM; those keys will fail `specdeploy check`"
        )
    command = head + [model] + kept + ["--speculative-config", speculative_json(spec)]
    host_data = {"target_model": model, "speculative_config": spec, **_host_data_for(kept)}
    return Migration(command=command, speculative_config=spec, host_data=host_data, notes=notes)


def _host_data_for(args: list[str]) -> dict:
    """Flags specdeploy manages become host data keys; the rest stay as vllm_extra_args."""
    data: dict = {}
    extra: list[str] = []
    i = 0
    while i < len(args):
        flag, _, inline = args[i].partition("=")
        field = MANAGED_FLAGS.get(flag)
        if field is None:
            extra.append(args[i])
            i += 1
            continue
        if field == "enable_prefix_caching":
            data[field] = flag == "--enable-prefix-caching"
            i += 1
            continue
        value = inline if inline else (args[i + 1] if i + 1 < len(args) else "")
        i += 1 if inline else 2
        annotation = ServeConfig.model_fields[field].annotation
        data[field] = _value(value) if annotation not in (str, str | None) else value
    if extra:
        data["vllm_extra_args"] = extra
    return data


def format_migration(result: Migration) -> str:
    lines = [
        "# Equivalent command:",
        result.shell(),
        "",
        "# specdeploy host data (group_data/*.py):",
    ]
    lines += [
        f"{key} = {pprint.pformat(value, sort_dicts=False)}"
        for key, value in result.host_data.items()
    ]
    lines += [f"# note: {note}" for note in result.notes]
    return "\n".join(lines)
