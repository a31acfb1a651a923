"""The write half of a folder: :class:`FolderWriter` (anonymous memory: :mod:`tdshare._write_anon`).

A write runs in three phases, so that a bad input never leaves a half-written directory:

1. **plan**: walk the tree, encode every file name, check every key, dtype, existing file and
   pickle (:func:`tdshare._plan.plan_tree`) without touching the disk;
2. **write**: leaf files first (in threads when asked), then non-tensor folders, then each
   level's ``meta.json`` replaced whole, children before parents (data first, metadata last);
   each leaf file is written and closed, not mapped: its result is a
   :class:`~tdshare._lazy_leaves.PendingLeaf` (with the file's inode), mapped on first read;
3. **install**: put the results into the tensordict (``memmap_``) or into a new one
   (``memmap``), then lock it (:mod:`tdshare._write_install`).  The source tensordict is changed
   only after every file is written, so an error leaves it as it was.

Over a folder that already holds a saved tree, a non-atomic write puts every leaf file under a
temporary name first (:func:`_stage`) and moves them over the old files only under the tree's
lock once all are written, just before the metadata: a failure while writing (a full disk)
leaves the old tree whole and loadable.  The same commit removes the debris of writers that
died in the tree (:mod:`tdshare._debris`).
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import threading
from typing import Any, ClassVar, TypeVar

import torch

from ._atomic import atomic_directory
from ._coordination import SharedRegistry, unchanged_since
from ._debris import sweep_staging, sweep_tree
from ._errors import MemmapError, NotAFolderError
from ._files import check_not_symlink, replace_file, tmp_name, write_file
from ._format import JOURNAL_FIELD, META_FILE
from ._future import TensorDictFuture
from ._journal import drop_journal
from ._lazy_leaves import resolve_under
from ._leaf_files import Listing, write_batch, write_leaf
from ._mapping_limits import check_descriptors, is_limit_error, limit_error
from ._memmap import MemoryMappedTensor
from ._nontensor_files import replace_if_changed, write_nontensor
from ._options import SaveOptions, Unsupported
from ._plan import LevelEncodings, PlannedLeaf, PlannedLevel, TreeWriter, plan_tree
from ._progress import ProgressCallback
from ._stack_write import stack_applies, write_stack
from ._tensordict_base import TensorDictBase
from ._write_install import blank, install, rebase_results
from ._write_results import leaf_file, remove_written, replaced_files, set_leaf_file

__all__ = ["FolderWriter"]

T = TypeVar("T", bound=TensorDictBase)


# -- phase 2: write ---------------------------------------------------------------------------
def _write_leaf(leaf: PlannedLeaf, existsok: bool) -> None:
    if leaf.reuse is not None:
        leaf.result = leaf.reuse
    elif leaf.src.numel() == 0:
        leaf.result = MemoryMappedTensor._wrap(torch.empty(leaf.src.shape, dtype=leaf.src.dtype), None, None, None)
    else:
        assert leaf.path is not None
        leaf.result = write_leaf(leaf.src, leaf.path, existsok, mapped=leaf.part)  # a nested tensor's part: mapped


def _write_level(level: PlannedLevel, existsok: bool, listing: Listing) -> None:
    """Write a level's leaves in the calling thread; the plain ones of a folder found empty as one batch."""
    if level.plain:
        assert level.path is not None
        if level.empty:
            names = None if level.schema is None else level.schema.files
            level.plain_out = write_batch(level.path, level.plain, existsok, listing, names)
        else:
            level.plain_out = [write_leaf(src, path, existsok) for src, path, _ in level.plain]
    for leaf in level.leaves:
        _write_leaf(leaf, existsok)


def _as_records(root: PlannedLevel) -> None:
    """Turn the plain leaves into :class:`PlannedLeaf` records, which the thread pool writes."""
    for level in root.walk():
        level.leaves.extend(
            PlannedLeaf(k, src, path) for k, (src, path, _) in zip(level.plain_keys, level.plain, strict=True)
        )
        level.plain_keys, level.plain = [], []


def _make_dirs(root: PlannedLevel) -> list[str]:
    """Make every level's folder, parents first; return the folders made."""
    made = []
    for level in reversed(root.walk()):  # parents first
        assert level.path is not None
        try:
            os.mkdir(level.path)  # the common case: a new folder in a folder just made, nothing to check
            level.empty = True
            made.append(level.path)
        except OSError:
            os.makedirs(level.path, exist_ok=True)
            check_not_symlink(level.path)
            try:
                with os.scandir(level.path) as entries:  # e.g. a fresh tempfile.mkdtemp()
                    level.empty = next(entries, None) is None
            except OSError:  # a folder we may write but not list
                level.empty = False
    return made


def _write_metadata(root: PlannedLevel, fresh: bool = False) -> tuple[bool, bool]:
    """Write every level's metadata, children first; return (anything changed, any level kept).

    A level whose metadata is exactly what this tensordict last read from disk (``_meta_seen``:
    it was loaded or refreshed and not restructured since) is not rewritten, so entries other
    processes added in the meantime survive a ``load(...).memmap_()``.  ``fresh``: the tree held
    no saved tensordict, so no file is compared with what was there before it is replaced.
    """
    changed = kept = False
    encodings = LevelEncodings()  # equal levels (a lazy stack's members, usually) encoded once
    for level in root.walk():  # children first: a level's meta.json only names complete children
        assert level.path is not None
        for nt in level.nontensors:
            assert nt.path is not None
            changed = write_nontensor(nt.path, nt.meta, nt.pickled, nt.pickle_name) or changed
        for w in level.wrapped:  # after its collection (walk() lists it first)
            assert w.path is not None
            changed = write_nontensor(w.path, w.meta, None) or changed
        if level.stack is not None:  # a lazy stack: its members are written (walk() lists them first)
            target = level.path + os.sep + META_FILE
            if fresh:
                _put_meta(level, root, level.stack_meta)
                changed = True
            else:
                changed = replace_if_changed(target, level.stack_meta) or changed
            continue
        src = level.src
        meta = encodings.meta(level)
        seen = src._meta_seen
        if seen is not None and JOURNAL_FIELD in seen:  # the record's field is the folder's, not the tensordict's
            seen = {k: v for k, v in seen.items() if k != JOURNAL_FIELD}
        if seen is not None and meta == seen and src._memmap_prefix == level.path:
            kept = True
            continue
        data = encodings.data(level)
        if fresh:
            _put_meta(level, root, data)
            changed = True
        else:
            changed = replace_if_changed(os.path.join(level.path, META_FILE), data) or changed
            drop_journal(level.path)  # meta.json now says everything: a record left would add stale entries
        src._meta_seen = meta
    return changed, kept


def _put_meta(level: PlannedLevel, root: PlannedLevel, data: bytes) -> None:
    """Write the ``meta.json`` of a level of a tree that held no saved tensordict.

    The root's replaces any file there whole (temporary name, then rename): it is what makes
    the tree a saved one, so a reader sees none or all of it.  A level below it, in a folder
    found empty, is written in place (one rename fewer a level): no reader of the tree reads it
    before the root's exists.
    """
    assert level.path is not None
    target = level.path + os.sep + META_FILE
    if level is not root and level.empty:
        write_file(target, data, stat=False)  # (an existing file, made since, is replaced whole)
    else:
        replace_file(target, data)


# -- staged leaf files (a non-atomic write over a saved tree) -------------------------------------
Staged = dict[str, str]  # temporary path -> final path


def _stage(root: PlannedLevel) -> Staged:
    """Point every leaf file the write creates at a temporary name beside its final one."""
    staged: Staged = {}
    for level in root.walk():
        if level.plain:
            plain = []
            for src, path, info in level.plain:
                tmp = tmp_name(path)
                staged[tmp] = path
                plain.append((src, tmp, info))
            level.plain = plain
            level.empty = False  # write_batch's listing trick wants a folder found empty
        for leaf in level.leaves:
            if leaf.reuse is None and leaf.path is not None and leaf.src.numel():
                tmp = tmp_name(leaf.path)
                staged[tmp] = leaf.path
                leaf.path = tmp
    return staged


def _unstage(root: PlannedLevel, staged: Staged) -> None:
    """Move every staged file over its final name (the caller holds the lock); fix the results' names."""
    for tmp, final in staged.items():
        os.replace(tmp, final)
    for level in root.walk():
        for i, (src, path, info) in enumerate(level.plain):
            level.plain[i] = (src, staged.get(path, path), info)
        for out in level.plain_out:
            set_leaf_file(out, staged.get(leaf_file(out) or ""))
        for leaf in level.leaves:
            if leaf.path is not None and leaf.path in staged:
                leaf.path = staged[leaf.path]
            r = leaf.result
            if r is not None and r is not leaf.reuse:
                set_leaf_file(r, staged.get(leaf_file(r) or ""))


def _discard(staged: Staged) -> None:
    """Remove the staged files of a write that failed: the old tree stays as it was."""
    for tmp in staged:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _renamed(err: OSError, staging: str, path: str) -> OSError:
    """``err`` (its errno, so its subclass too) with the staging folder's name replaced by ``path``."""
    text = (err.strerror or str(err)).replace(staging, path)
    filename = err.filename.replace(staging, path) if isinstance(err.filename, str) else err.filename
    return OSError(err.errno, text, filename) if filename is not None else OSError(err.errno, text)


def _check_space(root: PlannedLevel, path: str) -> None:
    """Raise ``OSError(ENOSPC)`` naming ``path`` and the sizes when its file system has too little
    free space for every leaf file of the write (one ``statvfs``: cheap, and only a first check)."""
    need = sum(src.nbytes for lvl in root.walk() for src, _, _ in lvl.plain)
    need += sum(leaf.src.nbytes for lvl in root.walk() for leaf in lvl.leaves if leaf.reuse is None)
    if not need:
        return
    try:
        st = os.statvfs(path)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise OSError(
            errno.ENOSPC,
            f"Not enough free space to save under {path!r}: the leaf files need {need} bytes, the file system "
            f"has {free} free. Free some space or save elsewhere",
            path,
        )


def _commit_metadata(
    root: PlannedLevel,
    registry: SharedRegistry | None,
    seen: tuple[int, int] | None,
    staged: Staged | None = None,
) -> tuple[int, int] | None:
    """Write the metadata, under the tree's lock with a generation bump when anything changed.

    ``registry`` is None for a folder that held no saved tensordict before this write: nobody
    can be sharing it yet, so no control files are made.  ``staged``: leaf files written under
    temporary names, moved into place under the lock just before the metadata (after the
    debris of dead writers is removed).  Returns the registry state the written tensordict is
    current with (``seen``, its state before, when levels kept newer disk content).
    """
    if registry is None:
        _write_metadata(root, fresh=True)
        return None
    wrote_data = any(
        lvl.plain or any(leaf.reuse is None and leaf.src.numel() for leaf in lvl.leaves) for lvl in root.walk()
    )
    with registry.lock():
        before = registry.state(create=True)
        if staged is not None:
            assert root.path is not None
            sweep_tree(root.path, orphans=True)  # under the lock: no live writer has unnamed leaf files
            if any(os.path.lexists(final) for final in staged.values()):
                registry.mark_replacing()  # files are about to be replaced: see EpochGuard
            _unstage(root, staged)
        changed, kept = _write_metadata(root)
        after = registry.bump(files_replaced=wrote_data) if changed or wrote_data else before
        registry.rebase_guards(before, after)  # our own replacements: their unread leaves were mapped first
    return after if not kept or unchanged_since(seen, before) else seen


# -- entry point ------------------------------------------------------------------------------
_EXECUTORS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_EXECUTORS_LOCK = threading.Lock()


def _executor(num_threads: int) -> concurrent.futures.ThreadPoolExecutor:
    with _EXECUTORS_LOCK:
        ex = _EXECUTORS.get(num_threads)
        if ex is None:
            ex = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="tdshare-write")
            _EXECUTORS[num_threads] = ex
        return ex


def _after_fork_in_child() -> None:
    # threads do not survive a fork, and a lock another thread held then would stay held
    global _EXECUTORS_LOCK
    _EXECUTORS.clear()
    _EXECUTORS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_FILES_PER_WRITE = 8  # a leaf file, a metadata file, the tree's lock and control files, with room


class FolderWriter(TreeWriter):
    """The write half of a folder: one file per leaf, ``meta.json`` per level, atomic swap on request.

    Commit order: leaf files, then non-tensor folders, then each level's ``meta.json`` replaced
    whole (children first), then a generation bump under the tree's lock when the folder held a
    saved tree before.  ``atomic=True`` writes the whole tree into a staging folder beside
    ``path`` and swaps it in (:mod:`tdshare._atomic`), holding the lock so no entry is added to the
    old tree meanwhile.
    """

    name = "a folder"
    unsupported: ClassVar[Unsupported] = {}

    def __init__(self, path: str) -> None:
        self.path = path

    def save(self, td: T, opts: SaveOptions, *, inplace: bool) -> T | TensorDictFuture[T]:
        path = self.path
        if os.path.lexists(path) and not os.path.isdir(path):
            raise NotAFolderError(
                f"The prefix {path!r} is a file, but a folder is written there (one file per leaf): remove the "
                "file or choose another prefix, or end the prefix with '.tdz' to write one archive file."
            )
        sweep_staging(os.path.dirname(os.path.realpath(path)))  # dead atomic writers' (or their trees, put back)
        fresh = not os.path.exists(os.path.join(path, META_FILE))
        registry = None if fresh else SharedRegistry.for_directory(path)
        if opts.atomic:
            if not fresh:  # this process's leaves loaded from here and not read yet keep their bytes
                resolve_under(os.path.abspath(path))
            return self._save_atomic(td, opts, inplace, registry)
        if fresh and stack_applies(td, opts):  # a lazy stack's first save: its members in one loop
            done = write_stack(td, path, opts, inplace=inplace)
            if done is not None:
                return done
        seen = td._generation if td._memmap_prefix == path else None
        root = plan_tree(td, path, opts.robust_key, opts.copy_existing, opts.existsok)
        root.share = opts.share_non_tensor
        if not fresh:  # this process's leaves loaded from the files replaced and not read yet keep their bytes
            resolve_under(os.path.abspath(path), replaced_files(root))
        check_descriptors(_FILES_PER_WRITE + opts.num_threads, f"Saving to {path!r}")
        dest = td if inplace else blank(td)
        staged = None
        if not fresh:  # never damage the saved tree: new files under new names, moved in at the commit
            _check_space(root, path)
            staged = _stage(root)
        made = _make_dirs(root)
        if opts.return_early and opts.num_threads > 1:
            return _write_in_background(root, dest, path, opts.num_threads, opts.existsok, registry, seen, staged)
        try:
            _run_writes(root, opts.num_threads, opts.existsok, opts.progress)
            gen = _commit_metadata(root, registry, seen, staged) if fresh else None
        except BaseException as err:
            if staged:
                _discard(staged)
            if fresh:
                remove_written(root, made)
            if isinstance(err, OSError) and is_limit_error(err):
                raise limit_error(err, path) from err
            raise
        if not fresh:
            gen = _commit_metadata(root, registry, seen, staged)
        install(root, dest, path)
        dest._generation = gen
        return dest

    def _save_atomic(self, td: T, opts: SaveOptions, inplace: bool, registry: SharedRegistry | None) -> T:
        path = self.path
        # Always under the tree's lock, a new tree too: concurrent atomic saves of one prefix take
        # turns (two first saves would both rename onto the same name), and no additions land
        # while the old tree is swapped out.
        os.makedirs(os.path.dirname(os.path.realpath(path)), exist_ok=True)
        lock_owner = registry if registry is not None else SharedRegistry.for_directory(path)
        with lock_owner.lock():
            if registry is None and os.path.isfile(os.path.join(path, META_FILE)):
                registry = lock_owner  # another writer made the tree while we waited: its readers refresh
            with atomic_directory(path, opts.existsok) as staging:
                try:
                    root = plan_tree(td, staging, opts.robust_key, opts.copy_existing, existsok=True)
                except MemmapError as err:  # name the target, not the staging folder
                    raise type(err)(str(err).replace(staging, path)) from None
                root.share = opts.share_non_tensor
                try:
                    _check_space(root, staging)
                    _make_dirs(root)
                    _run_writes(root, opts.num_threads, True, opts.progress)
                    _write_metadata(root, fresh=True)
                except OSError as err:  # name the target, not the staging folder
                    raise _renamed(err, staging, path) from err
                if registry is not None:
                    registry.mark_replacing()  # before the swap: see EpochGuard
            gen = registry.bump(files_replaced=True) if registry is not None else None
        rebase_results(root, staging, path)
        dest = td if inplace else blank(td)
        install(root, dest, path)
        dest._generation = gen
        return dest


def _run_writes(root: PlannedLevel, num_threads: int, existsok: bool, progress: ProgressCallback | None = None) -> None:
    """Write every leaf file of the tree; ``progress(done, total)`` after each level (each leaf
    with threads), from the calling thread.  The results are pending leaves, mapped on first read
    (the parts of a nested tensor excepted)."""
    levels = root.walk()
    total = sum(len(lvl.leaves) + len(lvl.plain) for lvl in levels)
    if num_threads > 1 and total > 1:  # only when asked
        _as_records(root)
        leaves = [leaf for lvl in levels for leaf in lvl.leaves]
        futures = [_executor(num_threads).submit(_write_leaf, leaf, existsok) for leaf in leaves]
        done = 0
        for _ in concurrent.futures.as_completed(futures):  # every one finishes before an error is raised
            done += 1
            if progress is not None:
                progress(done, total)
        for f in futures:
            f.result()
    else:
        listing = Listing()
        done = 0
        for level in levels:
            _write_level(level, existsok, listing)
            if progress is not None and (level.leaves or level.plain):
                done += len(level.leaves) + len(level.plain)
                progress(done, total)


def _write_in_background(
    root: PlannedLevel,
    dest: T,
    path: str,
    num_threads: int,
    existsok: bool,
    registry: SharedRegistry | None,
    seen: tuple[int, int] | None,
    staged: Staged | None = None,
) -> TensorDictFuture[T]:
    """Write the leaves in the pool; the last one to finish commits the metadata and installs.

    The commit runs in a completion callback rather than as a pool job waiting on the others, so
    concurrent early-returning writes can never fill the pool with waiting jobs and deadlock.
    """
    _as_records(root)
    leaves = [leaf for lvl in root.walk() for leaf in lvl.leaves]
    committed: concurrent.futures.Future[None] = concurrent.futures.Future()
    remaining = [len(leaves)]
    lock = threading.Lock()
    futures: list[concurrent.futures.Future[Any]] = []

    def commit() -> None:
        try:
            try:
                for f in futures:
                    f.result()
            except BaseException:
                if staged:
                    _discard(staged)
                raise
            gen = _commit_metadata(root, registry, seen, staged)
            install(root, dest, path)
            dest._generation = gen
        except BaseException as err:  # delivered by TensorDictFuture.result()
            committed.set_exception(err)
        else:
            committed.set_result(None)

    def on_done(_: concurrent.futures.Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            commit()

    ex = _executor(num_threads)
    futures.extend(ex.submit(_write_leaf, leaf, existsok) for leaf in leaves)
    if not leaves:
        commit()
    for f in list(futures):
        f.add_done_callback(on_done)
    return TensorDictFuture([*futures, committed], dest)
