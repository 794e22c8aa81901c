"""Object storage (gs://, s3://): filesystem options, credentials, and the checks a prefix needs.

Object stores have no folders: a "folder" input is a prefix, which exists when something is
under it. Every process that touches a bucket (the launcher, each encode process, each Beam
worker) calls `configure` once with the same Beam flags, so S3's endpoint and keys and the
credential decision travel with the work rather than with a process.
"""

import contextlib
import logging
import os
import re
import threading

_LOG = logging.getLogger(__name__)
_LOCK = threading.Lock()
_CONFIGURED = {}  # flags -> True, for this process


class StorageError(ValueError):
    """A bucket or prefix that can't be used; the message names it and the next step."""


# Beam's FileSystems.URI_SCHEMA_PATTERN: the same answer without importing Beam.
_URI_SCHEME = re.compile(r"(?P<scheme>[a-zA-Z][-a-zA-Z0-9+.]*)://.*")


def _raw_scheme(uri: str):
    found = _URI_SCHEME.match(uri.strip())
    return found.group("scheme") if found else None


def scheme(uri: str) -> str:
    """'gs', 's3', ... or '' for a local path."""
    found = _raw_scheme(uri)
    return "" if found in (None, "file") else found


# --- Files by path: plain paths through os, everything else through Beam's FileSystems ---------
# The encode pool's processes import only what the per-image work needs. Importing Beam costs
# each of them 2-3 s of CPU at start-up, next to the launcher's own import, and the forkserver
# seconds more at exit; so Beam is imported where a path has a scheme (gs://, s3://, file://).


def filesystems():
    """Beam's FileSystems, imported on first use."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _plain(uri: str) -> bool:
    return _raw_scheme(uri) is None


def create(uri: str, gzip: bool = False):
    """A new file for writing (its folder made on local disk), uncompressed unless gzip."""
    if _plain(uri) and not gzip:
        folder = os.path.dirname(uri)
        if folder:
            os.makedirs(folder, exist_ok=True)
        return open(uri, "wb")
    from apache_beam.io.filesystem import CompressionTypes

    kind = CompressionTypes.GZIP if gzip else CompressionTypes.UNCOMPRESSED
    return filesystems().create(uri, mime_type="application/octet-stream", compression_type=kind)


def join(base: str, *parts: str) -> str:
    return os.path.join(base, *parts) if _plain(base) else filesystems().join(base, *parts)


def rename(src: str, dst: str) -> None:
    """Move one file; replaces `dst` (os.rename; copy-then-delete on gs:// and s3://)."""
    if _plain(src) and _plain(dst):
        os.rename(src, dst)
    else:
        filesystems().rename([src], [dst])


def bucket_of(uri: str) -> str:
    return uri.split("://", 1)[1].split("/", 1)[0]


def configure(flags=(), uris=()) -> None:
    """Give Beam's FileSystems these flags in this process; decide GCS credentials once, fast."""
    from apache_beam.options.pipeline_options import PipelineOptions

    key = tuple(flags)
    with _LOCK:
        if key in _CONFIGURED:
            return
        options = PipelineOptions(list(flags))
        filesystems().set_options(options)  # the S3 filesystem reads its endpoint and keys here
        _let_s3_write_empty_objects()
        if any(scheme(u) == "gs" for u in uris):
            _gcs_credentials(options)
        _CONFIGURED[key] = True


def _let_s3_write_empty_objects() -> None:
    """Beam's S3 uploader completes a multipart upload of an empty file with no parts, which S3
    refuses (MalformedXML): a conversion with no rejects failed writing its empty rejected.jsonl.
    The one part of an empty object is sent empty instead (S3 has no minimum for the last part)."""
    try:
        from apache_beam.io.aws import s3io
    except ImportError:  # no boto3: no s3:// here
        return
    uploader = s3io.S3Uploader
    if getattr(uploader, "_beam_etl_empty_ok", False):
        return
    finish = uploader.finish

    def finish_even_empty(self):
        if not self.parts and not self.buffer:
            self._write_to_s3(b"")
        return finish(self)

    uploader.finish, uploader._beam_etl_empty_ok = finish_even_empty, True


def configure_for(uri: str, flags=()) -> None:
    """configure() for a worker about to read `uri`; free after the first call."""
    if tuple(flags) not in _CONFIGURED and scheme(uri):
        configure(flags, [uri])


def _gcs_credentials(options) -> None:
    """Anonymous access where there are no credentials, without Beam's ~25 s of retries.

    Beam 2.77 retries google.auth.default() with backoff (2+4+8+16 s) before it connects
    anonymously; it has no public switch for this. One probe here takes 0.3 s. With no
    credentials (or an emulator, which takes none) the cache Beam itself fills is set to the
    value Beam would reach after its retries: anonymous.
    """
    try:
        from apache_beam.internal.gcp import auth
    except ImportError:  # Beam without [gcp]: gs:// fails later with Beam's own message
        return
    anonymous = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    if not anonymous:
        try:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError
        except ImportError:
            return
        try:
            google.auth.default()
        except DefaultCredentialsError:
            anonymous = True
            _LOG.warning("no Google credentials found: reading gs:// anonymously (public buckets "
                         "only); run `gcloud auth application-default login` for private ones")
    credentials = getattr(auth, "_Credentials", None)
    if anonymous and credentials is not None and hasattr(credentials, "_credentials_init"):
        with credentials._credentials_lock:
            credentials._credentials, credentials._credentials_init = None, True


def _explain(uri: str, error: Exception) -> str:
    """One line for a failed bucket call: missing bucket, no access, or the error itself."""
    text = str(error)
    for cause in getattr(error, "exception_details", {}).values():
        text += f" {type(cause).__name__}: {cause}"
    lower = text.lower()
    bucket = f"{scheme(uri)}://{bucket_of(uri)}"
    if "nosuchbucket" in lower or "404" in lower or "not found" in lower:
        return f"bucket {bucket} does not exist; check the name"
    if any(s in lower for s in ("401", "403", "accessdenied", "forbidden", "credential", "anonymous")):
        return (f"no access to {bucket} ({text.strip()[:160]}); check your credentials: "
                "GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login` for gs://, "
                "--s3_access_key_id/--s3_secret_access_key or AWS_* variables for s3://")
    return f"cannot list {uri}: {text.strip()[:200]}"


def bucket_exists(uri: str) -> bool:
    """Whether the bucket of `uri` exists; StorageError when it can't be asked."""
    kind, bucket = scheme(uri), bucket_of(uri)
    try:
        if kind == "gs":
            return _new_io("gs").get_bucket(bucket) is not None
        if kind == "s3":
            return _s3_bucket_exists(bucket)
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - each client raises its own types; say it in one line
        raise StorageError(f"{uri}: {_explain(uri, e)}") from None
    return True  # other schemes: the listing will tell


def _s3_bucket_exists(bucket: str) -> bool:
    import boto3
    import botocore.exceptions
    from apache_beam.options.pipeline_options import PipelineOptions, S3Options

    opts = (filesystems()._pipeline_options or PipelineOptions()).view_as(S3Options)
    client = boto3.client(
        "s3",
        endpoint_url=opts.s3_endpoint_url,
        aws_access_key_id=opts.s3_access_key_id,
        aws_secret_access_key=opts.s3_secret_access_key,
        aws_session_token=opts.s3_session_token,
        region_name=opts.s3_region_name,
        verify=opts.s3_verify,
        use_ssl=not opts.s3_disable_ssl,
    )
    try:
        client.head_bucket(Bucket=bucket)
        return True
    except botocore.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise


@contextlib.contextmanager
def explained(uri: str, flag: str = "--input"):
    """Turn a failed bucket call under this block into one StorageError line naming `uri`."""
    try:
        yield
    except StorageError as e:
        message = str(e)
        raise StorageError(message if message.startswith("--") else f"{flag} {message}") from None
    except Exception as e:  # noqa: BLE001 - narrowed here: Beam's error type is imported only now
        from apache_beam.io.filesystem import BeamIOError

        ours = isinstance(e, ValueError) and type(e) is not ValueError  # a subclass: InputError
        if not isinstance(e, (BeamIOError, OSError, ValueError)) or not scheme(uri) or ours:
            raise  # a local path's error says it already
        raise StorageError(f"{flag} {uri}: {_explain(uri, e)}") from None


def check_bucket(uri: str, flag: str = "--input") -> None:
    """StorageError unless the bucket of `uri` exists and can be read (no-op for local paths)."""
    with explained(uri, flag):
        if scheme(uri) and not bucket_exists(uri):
            raise StorageError(f"{flag} {uri}: bucket {scheme(uri)}://{bucket_of(uri)} does not exist; "
                               "check the name")


_IO = threading.local()  # per thread: (scheme, options id) -> Beam's GcsIO or S3IO


def open_read(uri: str):
    """A readable file for `uri`: on gs:// and s3:// through one Beam client per thread.

    Why: Beam's S3 filesystem builds a new boto3 session and client for every open, about
    200 ms of CPU against 5 ms per object with a reused client (measured on moto, 50 KB
    objects); its GCS filesystem a new client too (8 against 3 ms). Per thread because the
    read-ahead threads share a process and google-cloud-storage's client is not thread-safe.
    """
    kind = scheme(uri)
    if _plain(uri):
        return open(uri, "rb")
    if kind not in ("gs", "s3"):
        from apache_beam.io.filesystem import CompressionTypes

        return filesystems().open(uri, compression_type=CompressionTypes.UNCOMPRESSED)
    return _client(kind).open(uri)


def read_range(uri: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file, in one request on gs:// and s3:// (a ranged GET).

    Why not a seek on an open file: Beam's readers fetch 16 MB from the position on every
    seek outside their buffer, and GCS's reader first asks for the object's metadata.
    """
    if end <= start:
        return b""
    kind = scheme(uri)
    if kind not in ("gs", "s3"):
        with open_read(uri) as f:
            f.seek(start)
            return f.read(end - start)
    bucket, name = uri.split("://", 1)[1].split("/", 1)
    if kind == "gs":  # end is inclusive here
        blob = _client(kind).client.bucket(bucket).blob(name)
        return blob.download_as_bytes(start=start, end=end - 1, checksum=None, raw_download=True)
    body = _client(kind).client.client.get_object(Bucket=bucket, Key=name, Range=f"bytes={start}-{end - 1}")["Body"]
    try:
        return body.read()
    finally:
        body.close()


def _client(kind: str):
    """This thread's Beam GcsIO or S3IO for the current pipeline options."""
    key = (kind, id(filesystems()._pipeline_options))
    clients = _IO.__dict__.setdefault("clients", {})
    if key not in clients:
        clients[key] = _new_io(kind)
    return clients[key]


def _new_io(kind: str):
    from apache_beam.options.pipeline_options import PipelineOptions

    options = filesystems()._pipeline_options or PipelineOptions()
    if kind == "gs":
        from apache_beam.io.gcp import gcsio

        return gcsio.GcsIO(pipeline_options=options)
    from apache_beam.io.aws import s3io

    return s3io.S3IO(options=options)


def check_output(output: str) -> None:
    """Check, before any work, that an output's bucket exists."""
    kind = scheme(output)
    if not kind:
        return
    with explained(output, "--output"):
        if not bucket_exists(output):
            raise StorageError(f"--output {output}: bucket {kind}://{bucket_of(output)} does not exist; "
                               "create it first")


def copy_file(src: str, dst: str) -> None:
    """Copy one file across filesystems (local to a bucket) by streaming it through Beam."""
    import shutil

    with open_read(src) as fin, create(dst) as fout:
        shutil.copyfileobj(fin, fout, 8 << 20)


def delete_tree(folder: str) -> None:
    """Delete a folder and everything under it; on an object store, every object under the prefix.

    Beam's GCS and S3 filesystems delete recursively only for a path that ends in "/"; without
    it they delete the one object of that name, which a "folder" never is.
    """
    if scheme(folder):
        filesystems().delete([folder.rstrip("/") + "/"])
        return
    _unlink_files(folder)
    filesystems().delete([folder])


def _unlink_files(folder: str, threads: int = 16) -> None:
    """Unlink the files under a local folder on 16 threads: on a disk mounted with `discard` each
    unlink of a written-back file waits for its trims, and 16 at a time took 0.6x the time of one
    at a time (64 files of 32 MB, docs/BENCHMARKS.md §19). What fails is left to the caller's delete."""
    from concurrent.futures import ThreadPoolExecutor

    paths = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]
    if len(paths) < 2:
        return

    def unlink(path):
        try:
            os.unlink(path)
        except OSError:
            pass

    with ThreadPoolExecutor(min(threads, len(paths))) as pool:
        list(pool.map(unlink, paths))
