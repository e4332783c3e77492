"""``opstate archive --once`` and ``opstate results NAME [--json] [--download DEST]`` (a retry
root's download adds its ``final.jsonl`` and ``final.json`` once written)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from opstate.cli.common import (
    EXIT_OK,
    CliError,
    UsageError,
    name_arg,
    open_store,
    out,
    print_json,
    require_gemini_key,
    settings_for,
    store_error,
)
from opstate.cli.views import print_view
from opstate.config import ConfigError

# What the retry runner writes beside final.jsonl (opstate.retry.finalize.FINAL_LEDGER_KEY).
FINAL_LEDGER_NAME = "final.json"


def add_parsers(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "archive", parents=[store], help="archive every pending result now (one pass)"
    )
    p.add_argument("--once", action="store_true", help="run one pass and exit (required)")
    p.set_defaults(func=cmd_archive)

    p = sub.add_parser("results", parents=[store, as_json], help="an operation's archived results")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--download",
        metavar="DEST",
        help="copy the archived objects (and a retry root's final.jsonl, final.json) into DEST",
    )
    p.set_defaults(func=cmd_results)


def cmd_archive(args: argparse.Namespace) -> int:
    if not args.once:
        raise UsageError(
            "archive runs one pass and needs --once (the archiver function repeats it)"
        )
    config = settings_for(args)
    from opstate.outcomes.run import ArchiveResult
    from opstate.outcomes.wiring import archive_from_settings, archiving

    try:
        with open_store(config, empty_if_missing=True) as store:
            # Nothing due: no key needed, no client made (google-genai never loaded).
            if next(archiving(store).iter_archive_due(time.time_ns()), None) is None:
                result = ArchiveResult()
            else:
                require_gemini_key(config)
                result = archive_from_settings(config, store=store)
    except CliError:
        raise
    except (ValueError, ConfigError) as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:
        error = store_error(config.store_url, exc, opened=True)
        if error is None:
            raise
        raise error from None
    view = result.as_dict()
    print_json(
        {k: view[k] for k in ("archived", "failed", "expired", "none", "bytes")}
        | {k: view[k] for k in ("skipped", "atRisk", "errors", "remaining")}
    )
    return EXIT_OK


def _download(config: Any, view: dict[str, Any], dest: Path, summary_location: str) -> int:
    """Copy the archived objects and summary.json into ``dest``. Every location is resolved
    first (``Sink.resolve``): one outside the results (``ROOT/../x``, a link out of the
    folder, another bucket or prefix) refuses the whole download before anything is written."""
    from pathlib import PurePosixPath

    from opstate.outcomes.sink import SinkError, download
    from opstate.outcomes.wiring import results_url_for, sink_from_url

    sink = sink_from_url(results_url_for(config), config)
    locations = [str(o["location"]) for o in view["objects"] if o.get("location")]
    if summary_location:
        locations.append(summary_location)
    locations.extend(_final_locations(view))
    try:
        names = [PurePosixPath(sink.resolve(location)).name for location in locations]
    except SinkError as exc:
        raise CliError(f"nothing downloaded: {exc}") from None
    for location, file_name in zip(locations, names, strict=True):
        try:
            size = download(sink, location, dest / file_name)
        except (SinkError, OSError) as exc:
            raise CliError(f"cannot copy {location} to {dest / file_name}: {exc}") from None
        out(f"{location} -> {dest / file_name} ({size} bytes)")
    return EXIT_OK


def _final_locations(view: dict[str, Any]) -> list[str]:
    """A retry root's ``final.jsonl`` and, beside it, ``final.json``, once written."""
    final = view.get("final")
    location = final.get("location") if isinstance(final, dict) else None
    if not isinstance(location, str) or final is None or final.get("status") != "final":
        return []
    folder, _, _ = location.rpartition("/")
    return [location, f"{folder}/{FINAL_LEDGER_NAME}"]


def _job_results(config: Any, store: Any, name: str, args: argparse.Namespace) -> int:
    """A job's results: its ``final.jsonl`` (and ``final.json``) once written (docs/jobs.md)."""
    from opstate.domain.retry import final_view, retry_view

    state = store.get_retry(name)
    doc = state.doc if state is not None else {}
    final = final_view(doc)
    if final["status"] != "final":
        waiting = retry_view(doc).get("job", {}).get("waitingFor", "its parts")
        raise CliError(f"{name}'s final result is not written yet (it waits for {waiting})")
    view = {"name": name, "status": "final", "objects": [], "final": final}
    if args.download:
        return _download(config, view, Path(args.download), "")
    print_json(view)
    return EXIT_OK


def cmd_results(args: argparse.Namespace) -> int:
    config = settings_for(args)
    from opstate.outcomes.results import results_json
    from opstate.outcomes.wiring import archiving

    name = name_arg(args.name)
    with open_store(config, must_exist=True) as store:
        record = store.get(name)
        if record is None:
            raise CliError(f"no record for {name} in {config.store_url}")
        if str(record.kind) == "job":  # a job (issue 46): its final result is its results
            return _job_results(config, store, name, args)
        view = results_json(store, name)
        state = archiving(store).get_archive(name)
    if view is None or state is None:
        raise CliError(f"{name} has no archive status yet (running, or not yet archived)")
    if args.download:
        if view["status"] != "archived":
            raise CliError(f"{name} is {view['status']}: nothing archived to download")
        return _download(config, view, Path(args.download), state.location)
    if args.json:
        print_json(view)
        return EXIT_OK
    if state.last_error:
        view = {**view, "error": f"{state.last_error} (attempts: {state.attempts})"}
    print_view(view)
    return EXIT_OK
