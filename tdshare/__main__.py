"""Command line: ``python -m tdshare pack|unpack|info|verify|status|gc``.

``pack FOLDER ARCHIVE`` packs a saved folder into a ``.tdz`` archive, ``unpack ARCHIVE FOLDER``
extracts one (checking every CRC), ``info PATH`` prints the keys, dtypes and shapes of a saved
folder or archive from its metadata alone (nothing is unpickled, no payload is read),
``verify PATH`` loads it with every check (sizes, dtypes, paths, and each archive entry's
CRC-32) and unpickles nothing unless ``--allow-pickle`` is given, ``status PATH`` prints where a
saved folder's lock and generation counter are and the generation, ``gc`` removes the runtime
folders of anonymous tensordicts whose processes are gone and the control files of trees that no
longer exist, and ``gc PATH...`` also the debris that killed writers left in or beside each saved
folder or archive (staging folders, temporary files, unreferenced leaf files; see
:mod:`tdshare._debris`) and reports the bytes freed.
"""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import json
import os
import shutil
import sys
from collections.abc import Callable

from ._archive import pack_memmap, unpack_memmap
from ._atomic import make_staging
from ._crc import crc32_threaded
from ._errors import CorruptDataError, FileExistsRuntimeError, TdshareError
from ._format import JOURNAL_FILE, META_FILE, VALUE, VALUE_STACK, layout_of, loads_json
from ._journal import merge_entries, parse_entries
from ._keys import encode_key
from ._progress import TerminalProgress
from ._tdz import Archive
from ._tensordict import TensorDict

Reader = Callable[[str], "bytes | None"]


def _reader(path: str) -> Reader:
    if os.path.isdir(path):

        def read_file(name: str) -> bytes | None:
            try:
                with open(os.path.join(path, *name.split("/")), "rb") as f:
                    return f.read()
            except (FileNotFoundError, NotADirectoryError):
                return None

        return read_file
    ar = Archive(path, "r")
    return lambda name: ar.read(name) if name in ar.entries else None


def _describe(read: Reader, d: str, shown: str, lines: list[str]) -> None:
    raw = read(d + META_FILE)
    if raw is None:
        lines.append(f"{shown or '.'}  (missing {META_FILE})")
        return
    meta = loads_json(raw, d + META_FILE)
    record = read(d + JOURNAL_FILE)  # entries added since the last compaction
    if record:
        meta = merge_entries(meta, parse_entries(record[: record.rfind(b"\n") + 1], d + JOURNAL_FILE))
    if layout_of(meta) in (VALUE, VALUE_STACK):
        value = repr(meta["data"]) if "data" in meta else "<pickled>"
        lines.append(f"{shown}  {value if len(value) <= 60 else value[:57] + '...'}")
        return
    if not shown:
        lines.append(f"batch_size {meta.get('shape')}")
    for key, entry in meta.items():
        if not isinstance(entry, dict):
            continue
        name = f"{shown}/{key}" if shown else key
        if "type" in entry:
            folder = next((n for n in (encode_key(key), key) if read(f"{d}{n}/{META_FILE}") is not None), None)
            if folder is None:
                lines.append(f"{name}  {entry['type']} (missing)")
            else:
                _describe(read, f"{d}{folder}/", name, lines)
        elif "dtype" in entry:
            lines.append(f"{name}  {str(entry['dtype']).removeprefix('torch.')}  {entry.get('shape')}")


def _verify(path: str, allow_pickle: bool) -> str:
    """Check every CRC of an archive, then load it (or a folder) with every check; raise on a problem."""
    checked = 0
    if os.path.isfile(path):
        ar = Archive(path, "r")
        bar = TerminalProgress("checking CRCs")
        try:
            for name, e in ar.entries.items():
                if e.method == 0 and crc32_threaded(ar.payload(e), 2) != e.crc:
                    raise CorruptDataError(f"{path}: the entry {name!r} fails its CRC-32 check; the archive is corrupt")
                checked += 1
                bar(checked, len(ar.entries))
        finally:
            bar.close()
    td = TensorDict.load(path, allow_pickle=allow_pickle)
    leaves = sum(1 for _ in td.keys(include_nested=True, leaves_only=True))
    crcs = f", {checked} entry CRCs" if checked else ""
    return f"ok: {path} ({leaves} leaves{crcs}; batch size {list(td.batch_size)})"


def _collect(paths: list[str]) -> list[str]:
    """Remove the debris of dead writers in or beside each path; one line per removal, then the total."""
    from ._coordination import SharedRegistry
    from ._debris import Swept, sweep_archive, sweep_staging, sweep_tree

    out = Swept()
    for given in paths:
        path = os.path.abspath(given)
        if os.path.isfile(path):
            sweep_archive(path, out)
            continue
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, f"gc: {path!r} is neither a saved folder nor an archive", path)
        sweep_staging(os.path.dirname(path), out)
        sweep_staging(path, out)  # a folder holding trees (the staging folders of its children)
        if os.path.isfile(os.path.join(path, META_FILE)):
            with SharedRegistry.for_directory(path).lock():  # no live make_memmap is between file and metadata
                sweep_tree(path, orphans=True, out=out)
        else:
            sweep_tree(path, orphans=False, out=out)
    if not out:
        return []
    return [f"removed {p}" for p in out] + [f"freed {out.freed} bytes ({len(out)} paths)"]


def _version() -> str:
    try:
        return importlib.metadata.version("tdshare")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="tdshare command line.")
    parser.add_argument("--version", action="version", version=f"tdshare {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("pack", help="pack a saved folder into a .tdz archive")
    pack.add_argument("folder", help="the saved folder (it holds a meta.json)")
    pack.add_argument("archive", help="the archive file to write (refused if it exists, unless --force)")
    pack.add_argument("--compression", default=None, help="stored (default), deflate, bzip2 or lzma")
    pack.add_argument("--level", type=int, default=None, help="compression level")
    pack.add_argument("--force", action="store_true", help="replace an existing archive")
    unpack = commands.add_parser("unpack", help="extract a .tdz archive into a folder")
    unpack.add_argument("archive", help="the .tdz archive to extract")
    unpack.add_argument("folder", help="the folder to extract into (refused if it holds files, unless --force)")
    unpack.add_argument("--force", action="store_true", help="replace an existing folder whole")
    info = commands.add_parser("info", help="print the keys, dtypes and shapes of a saved folder or archive")
    info.add_argument("path", help="a saved folder or .tdz archive (only its metadata is read)")
    verify = commands.add_parser("verify", help="load a saved folder or archive with every check, CRCs included")
    verify.add_argument("path", help="a saved folder or .tdz archive")
    verify.add_argument("--allow-pickle", action="store_true", help="also unpickle pickled values (trusted data only)")
    gc = commands.add_parser(
        "gc",
        help="remove the runtime folders of anonymous tensordicts whose processes are gone, the control "
        "files of trees that no longer exist, and the debris of killed writers in each PATH",
    )
    gc.add_argument(
        "paths", nargs="*", metavar="PATH", help="a saved folder, a .tdz archive, or a folder holding saved trees"
    )
    status = commands.add_parser("status", help="print where a saved folder's lock and generation counter are")
    status.add_argument("path", help="a saved folder (or a level in it)")
    return parser


def _unpack(archive: str, folder: str, force: bool) -> str:
    """Extract ``archive`` into ``folder``; with ``force`` an existing folder is replaced whole."""
    target = os.path.abspath(folder)
    if os.path.lexists(target) and not (os.path.isdir(target) and not os.listdir(target)):
        if not force:
            raise FileExistsRuntimeError(f"{target!r} already exists and is not empty: pass --force to replace it.")
        work = make_staging(os.path.dirname(target), target)
        try:
            _unpack_with_progress(archive, os.path.join(work, "new"))  # the old folder stays until this succeeds
            os.rename(target, os.path.join(work, "old"))
            os.rename(os.path.join(work, "new"), target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target
    return _unpack_with_progress(archive, target)


def _unpack_with_progress(archive: str, folder: str) -> str:
    bar = TerminalProgress("extracting entries")
    try:
        return unpack_memmap(archive, folder, progress=bar)
    finally:
        bar.close()


def _command_line_words(message: str) -> str:
    """A library message in the words of the command line (its arguments are flags here)."""
    return message.replace("allow_pickle=True", "--allow-pickle")


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    >>> main(["gc"])  # doctest: +SKIP
    nothing to clean
    0
    """
    prog = "tdshare" if os.path.basename(sys.argv[0]) == "tdshare" else "python -m tdshare"
    args = _parser(prog).parse_args(argv)
    try:
        if args.command == "pack":
            if os.path.lexists(args.archive) and not args.force:
                where = os.path.abspath(args.archive)
                raise FileExistsRuntimeError(f"{where!r} already exists: pass --force to replace it.")
            bar = TerminalProgress("packing files")
            try:
                out = pack_memmap(
                    args.folder, args.archive, compression=args.compression, compresslevel=args.level, progress=bar
                )
            finally:
                bar.close()
            print(out)
        elif args.command == "unpack":
            print(_unpack(args.archive, args.folder, args.force))
        elif args.command == "verify":
            print(_verify(os.path.abspath(args.path), args.allow_pickle))
        elif args.command == "gc":
            from ._control_files import reap_trees
            from ._runtime import reap

            lines = [f"removed the runtime store {path}" for path in reap()]
            lines += [f"removed the control files of {path} (the tree no longer exists)" for path in reap_trees()]
            lines += _collect(args.paths)
            print("\n".join(lines) if lines else "nothing to clean")
        elif args.command == "status":
            from ._coordination import SharedRegistry

            for name, value in SharedRegistry.for_path(os.path.abspath(args.path)).describe().items():
                print(f"{name}: {value}")
        else:
            lines = []
            _describe(_reader(os.path.abspath(args.path)), "", "", lines)
            print("\n".join(lines))
    except (TdshareError, OSError, json.JSONDecodeError) as err:
        print(f"{prog} {args.command}: error: {_command_line_words(str(err))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
