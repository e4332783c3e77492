"""Package a ``sam build`` output for a deploy without a clone, with no AWS credentials.

``python scripts/package.py BUILD_DIR OUT_DIR`` (``make package``: ``.aws-sam/build`` into
``dist/sam``) writes:

- ``OUT_DIR/artifacts/<LogicalId>.zip``: each built function's and layer's directory as the zip
  file Lambda takes (entries sorted, dated 1980-01-01, modes kept: the same build gives the same
  bytes);
- ``OUT_DIR/template.yaml``: the built template with every ``CodeUri``/``ContentUri`` pointing
  at its zip (a path relative to the template), and the architecture parameter that the
  functions' ``Architectures`` name pinned to the one the code was built for (a zip of x86_64
  wheels must not be deployed as arm64), and without the conditions nothing uses any more
  (``IsArm64`` chose the source template's arm64 code directories, which the built template
  names directly: cfn-lint's W8001 "Condition not used" otherwise);
- ``OUT_DIR/LICENSE`` and ``OUT_DIR/README.md``: the files the SAR metadata's LicenseUrl and
  ReadmeUrl name (``sam build`` wrote them relative to its own folder), named beside the
  template instead.

``sam deploy --template-file OUT_DIR/template.yaml`` uploads the zips itself (``--resolve-s3``)
and deploys; ``sam package`` turns the local paths into S3 URIs, which ``sam publish`` needs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import zipfile
from pathlib import Path
from typing import Any

from cfn_flip import dump_yaml, load_yaml

CODE_PROPERTY = {
    "AWS::Serverless::Function": "CodeUri",
    "AWS::Serverless::LayerVersion": "ContentUri",
}
EPOCH = (1980, 1, 1, 0, 0, 0)
METADATA_KEY = "AWS::ServerlessRepo::Application"
METADATA_FILES = ("LicenseUrl", "ReadmeUrl")


def zip_directory(source: Path, target: Path) -> None:
    """``source``'s files into ``target``, reproducibly (sorted, fixed dates, modes kept)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for dirpath, dirnames, filenames in os.walk(source):
            dirnames.sort()
            for filename in sorted(filenames):
                path = Path(dirpath) / filename
                info = zipfile.ZipInfo(path.relative_to(source).as_posix(), date_time=EPOCH)
                mode = stat.S_IMODE(path.stat().st_mode)
                info.external_attr = (stat.S_IFREG | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                with path.open("rb") as handle:
                    zf.writestr(info, handle.read())


def built_architecture(template: dict[str, Any]) -> str | None:
    """The one architecture ``sam build`` built for (its resources' BuildArchitecture)."""
    found = {
        resource["Metadata"]["BuildArchitecture"]
        for resource in template["Resources"].values()
        if isinstance(resource.get("Metadata"), dict)
        and "BuildArchitecture" in resource["Metadata"]
    }
    if len(found) > 1:
        raise SystemExit(f"package: the build mixes architectures {sorted(found)}")
    return next(iter(found), None)


def pin_architecture(template: dict[str, Any], architecture: str) -> list[str]:
    """Pin each parameter a function's ``Architectures`` names to ``architecture``."""
    lists = [template.get("Globals", {}).get("Function", {}).get("Architectures")]
    lists += [
        resource.get("Properties", {}).get("Architectures")
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Serverless::Function"
    ]
    named = {
        item["Ref"]
        for found in lists
        if isinstance(found, list)
        for item in found
        if isinstance(item, dict) and isinstance(item.get("Ref"), str)
    }
    pinned = []
    for name in sorted(named & set(template.get("Parameters", {}))):
        parameter = template["Parameters"][name]
        parameter["AllowedValues"] = [architecture]
        parameter["Default"] = architecture
        parameter["Description"] = (
            f"The code in this package was built for {architecture} (make package); "
            "build and package again for another architecture."
        )
        pinned.append(name)
    return pinned


def _conditions_named(value: Any) -> set[str]:
    """The conditions ``value`` uses: ``Fn::If``'s first item, ``{"Condition": NAME}`` (in
    ``Fn::And``/``Or``/``Not``, and a resource's or output's own ``Condition``)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "Fn::If" and isinstance(item, list) and item and isinstance(item[0], str):
                found.add(item[0])
            if key == "Condition" and isinstance(item, str):
                found.add(item)
            found |= _conditions_named(item)
    elif isinstance(value, list):
        for item in value:
            found |= _conditions_named(item)
    return found


def drop_unused_conditions(template: dict[str, Any]) -> list[str]:
    """Remove the conditions that nothing in the template uses any more (repeated: one used
    only by a removed one goes too); the names removed."""
    conditions = template.get("Conditions")
    if not isinstance(conditions, dict):
        return []
    dropped: list[str] = []
    while True:
        rest = {key: value for key, value in template.items() if key != "Conditions"}
        used = _conditions_named(rest) | _conditions_named(list(conditions.values()))
        unused = sorted(name for name in conditions if name not in used)
        if not unused:
            break
        for name in unused:
            del conditions[name]
        dropped += unused
    if not conditions:
        del template["Conditions"]
    return dropped


def _copy_metadata_files(template: dict[str, Any], build_dir: Path, out_dir: Path) -> None:
    """The SAR metadata's local files (``sam build`` rewrote them relative to its folder) copied
    beside the packaged template and named by their file name there."""
    meta = template.get("Metadata", {}).get(METADATA_KEY, {})
    for field in METADATA_FILES:
        location = meta.get(field)
        if not isinstance(location, str) or "://" in location:
            continue
        source = (build_dir / location).resolve()
        if not source.is_file():
            raise SystemExit(f"package: {METADATA_KEY}.{field} names no file: {source}")
        shutil.copyfile(source, out_dir / source.name)
        meta[field] = source.name


def package(build_dir: Path, out_dir: Path) -> dict[str, Any]:
    template: dict[str, Any] = load_yaml((build_dir / "template.yaml").read_text(encoding="utf-8"))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for logical_id, resource in sorted(template["Resources"].items()):
        prop = CODE_PROPERTY.get(resource["Type"])
        if prop is None:
            continue
        location = resource.get("Properties", {}).get(prop)
        if not isinstance(location, str) or "://" in location:
            raise SystemExit(f"package: {logical_id}.{prop} is not a built directory: {location!r}")
        source = (build_dir / location).resolve()
        if not source.is_dir():
            raise SystemExit(f"package: {source} is missing: run `make build` first")
        zip_directory(source, out_dir / "artifacts" / f"{logical_id}.zip")
        resource["Properties"][prop] = f"artifacts/{logical_id}.zip"
    architecture = built_architecture(template)
    if architecture is not None:
        pin_architecture(template, architecture)
    drop_unused_conditions(template)
    _copy_metadata_files(template, build_dir, out_dir)
    (out_dir / "template.yaml").write_text(dump_yaml(template), encoding="utf-8")
    return template


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("build_dir", type=Path, help="sam build's output (.aws-sam/build)")
    parser.add_argument("out_dir", type=Path, help="where to write the package (dist/sam)")
    args = parser.parse_args(argv)
    package(args.build_dir, args.out_dir)
    zips = sorted((args.out_dir / "artifacts").glob("*.zip"))
    size = sum(z.stat().st_size for z in zips)
    print(
        f"package: wrote {args.out_dir}/template.yaml and {len(zips)} zips ({size / 2**20:.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
