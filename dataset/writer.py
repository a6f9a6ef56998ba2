"""Writing a built dataset directory: atomically (built in a temporary directory beside the target, renamed at the
end, so a failed build leaves nothing behind) and one split's arrays with its ``dataset.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Iterator

import numpy as np

from dataset.errors import DatasetError
from dataset.metadata import DatasetMetadata, looks_like_dataset


@contextlib.contextmanager
def atomic_output_dir(output_dir: str, overwrite: bool = False) -> Iterator[str]:
    output_dir = os.path.abspath(output_dir)
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        if not overwrite:
            raise DatasetError(
                f"{output_dir}: output directory exists and is not empty (pass --overwrite to replace it)"
            )
        if not looks_like_dataset(output_dir):
            raise DatasetError(
                f"{output_dir}: --overwrite refuses to replace a directory that is not a dataset (no "
                f"identifiers.json, train/dataset.json or test/dataset.json); remove it yourself or "
                f"choose another --output-dir"
            )
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DatasetError(f"{output_dir}: exists and is not a directory")
    parent = os.path.dirname(output_dir)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.tmp-", dir=parent)
    except OSError as e:
        raise DatasetError(f"{output_dir}: cannot write the output directory here ({e.strerror or e})") from None
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(output_dir):
        old = output_dir + ".old-" + os.path.basename(tmp)
        os.rename(output_dir, old)
        os.rename(tmp, output_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, output_dir)


def save_split(split_dir: str, arrays: dict[str, np.ndarray], metadata: DatasetMetadata, set_name: str = "all") -> None:
    os.makedirs(split_dir, exist_ok=True)
    for k, v in arrays.items():
        np.save(os.path.join(split_dir, f"{set_name}__{k}.npy"), v)
    with open(os.path.join(split_dir, "dataset.json"), "w") as f:
        json.dump(metadata.model_dump(exclude_none=False, exclude={"identifiers_sha256"}), f, indent=1)


def set_default_dir_mode(path: str) -> None:
    """``tempfile.mkdtemp`` (used by :func:`atomic_output_dir`) creates 0700 directories; give a built
    directory the permissions a plain ``mkdir`` would (0777 minus the umask). Call on the temp dir."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o777 & ~mask)
