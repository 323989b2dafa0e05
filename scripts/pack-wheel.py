"""Packs the pipefill wheel from files a build tree already made (scripts/build-wheel.sh --build-dir).

`pip wheel .` would compile the whole library again (~6 minutes on 2 cores); the release build
tree of scripts/test.sh (or gpu-check.sh's tree on the GPU machine) has already built the very
extension the Python suite tested. This puts the same files in a wheel that `pip wheel .` makes:

  pipefill/...                    python/pipefill/ (wheel.packages of pyproject.toml), no caches
  pipefill/_pipefill.*.so, .pyi   what `cmake --install <tree> --component python` put in --stage
  pipefill-<v>.dist-info/         scikit-build-core's own metadata hook (METADATA, WHEEL with the
                                  running interpreter's tag, entry_points.txt, licenses/), + RECORD

Run it with the interpreter the tree's extension was built for (its tag names the wheel), from
any directory. Prints the wheel's path.
Usage: python scripts/pack-wheel.py --stage <dir with pipefill/_pipefill*.so> --out <dir>
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A fixed timestamp for every member (1980-01-01 is zip's epoch): the same files give the same wheel.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def copy_package(stage: Path) -> None:
    """python/pipefill into <stage>/pipefill, beside the installed extension (never over it)."""
    source = ROOT / "python" / "pipefill"
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        target = stage / "pipefill" / Path(dirpath).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            if name.endswith((".pyc", ".pyo")) or name.startswith("_pipefill."):
                continue
            shutil.copy2(Path(dirpath) / name, target / name)


def dist_info(work: Path) -> Path:
    """The .dist-info folder from scikit-build-core's prepare_metadata_for_build_wheel (no CMake run)."""
    from scikit_build_core.build import prepare_metadata_for_build_wheel

    metadata_dir = work / "metadata"
    metadata_dir.mkdir()
    cwd = os.getcwd()
    os.chdir(ROOT)  # the hook reads ./pyproject.toml and the license files
    try:
        name = prepare_metadata_for_build_wheel(str(metadata_dir))
    finally:
        os.chdir(cwd)
    return metadata_dir / name


def wheel_tag(info: Path) -> str:
    tags = [line.split(":", 1)[1].strip() for line in (info / "WHEEL").read_text().splitlines()
            if line.startswith("Tag:")]
    if len(tags) != 1:
        sys.exit(f"pack-wheel: expected one Tag line in {info / 'WHEEL'}, found {tags}")
    return tags[0]


def record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def write_wheel(stage: Path, info: Path, out: Path) -> Path:
    name_version = info.name[: -len(".dist-info")]
    wheel = out / f"{name_version}-{wheel_tag(info)}.whl"
    members: list[tuple[str, Path]] = []
    for root in (stage, info.parent):
        for path in sorted(root.rglob("*")):
            if path.is_file():
                members.append((path.relative_to(root).as_posix(), path))
    record_name = f"{info.name}/RECORD"
    records = []
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for arcname, path in members:
            data = path.read_bytes()
            member = zipfile.ZipInfo(arcname, ZIP_TIME)
            member.external_attr = (0o755 if os.access(path, os.X_OK) else 0o644) << 16
            member.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(member, data)
            records.append(record_line(arcname, data))
        records.append(f"{record_name},,")
        member = zipfile.ZipInfo(record_name, ZIP_TIME)
        member.external_attr = 0o644 << 16
        member.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(member, "\n".join(records) + "\n")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=Path, required=True,
                        help="folder holding pipefill/_pipefill*.so (cmake --install ... --prefix)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the wheel")
    args = parser.parse_args()
    stage = args.stage.resolve()
    extensions = list((stage / "pipefill").glob("_pipefill.*.so"))
    if len(extensions) != 1:
        sys.exit(f"pack-wheel: expected one pipefill/_pipefill.*.so in {stage}, found {extensions}")
    copy_package(stage)
    with tempfile.TemporaryDirectory(prefix="pipefill-pack-") as tmp:
        info = dist_info(Path(tmp))
        abi = extensions[0].name.split(".")[1]  # cpython-311-x86_64-linux-gnu
        tag = wheel_tag(info)
        interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
        if not abi.startswith(f"cpython-{sys.version_info.major}{sys.version_info.minor}") or \
                not tag.startswith(interpreter):
            sys.exit(f"pack-wheel: {extensions[0].name} was not built for this interpreter "
                     f"({sys.executable}, tag {tag}): run this with the build tree's Python")
        print(write_wheel(stage, info, args.out.resolve()))


if __name__ == "__main__":
    main()
