"""Real GCS and S3 API servers on 127.0.0.1 for the tests: gcp-storage-emulator and moto's server.

Beam's gcsio follows STORAGE_EMULATOR_HOST. TensorFlow's own gs:// client does not: its hosts
are compiled in (www.googleapis.com, storage.googleapis.com). It does honour https_proxy and
CURL_CA_BUNDLE, so `TlsProxy` accepts its CONNECT tunnels, ends TLS with a throwaway
certificate for those two names and forwards each request to the emulator, smoothing the
three places where TF's client and the emulator disagree (see ../shared/README.md).

`python -m tests.objstore_servers` starts both servers and prints the environment to use.
"""

import datetime
import http.client
import json
import os
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
BUCKET = "bkt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def _stop(proc: subprocess.Popen, log) -> None:
    """Terminate a server process (kill it after 10 s) and close its log."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()


def _executable(name: str) -> str:
    """A console script of this venv (beside sys.executable), else from PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.path.exists(here) else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed: pip install -c constraints.txt -e '.[dev]'")
    return found


def make_certificates(folder: str) -> tuple:
    """A throwaway CA and a certificate for GOOGLE_HOSTS signed by it: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(name("beam-etl test CA")).issuer_name(name("beam-etl test CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder().subject_name(name(GOOGLE_HOSTS[0])).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tuple(os.path.join(folder, n) for n in ("ca.pem", "cert.pem", "key.pem"))
    pem = serialization.Encoding.PEM
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(pem))
    with open(paths[1], "wb") as f:
        f.write(cert.public_bytes(pem))
    with open(paths[2], "wb") as f:
        f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


STORAGE_LAYOUT = json.dumps({"kind": "storage#storageLayout", "hierarchicalNamespace": {"enabled": False}}).encode()


class _Tunnel(socketserver.StreamRequestHandler):
    """One CONNECT tunnel from TF's client: TLS, then HTTP requests forwarded to the emulator."""

    def handle(self):
        line = self.rfile.readline(65537).decode("latin-1")
        _read_headers(self.rfile)
        method, target = (line.split() + ["", ""])[:2]
        if method != "CONNECT" or target.split(":")[0] not in GOOGLE_HOSTS:
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            return
        reader, writer = tls.makefile("rb"), tls.makefile("wb")
        try:
            while self._one_request(reader, writer):
                pass
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            for f in (reader, writer):
                try:
                    f.close()
                except OSError:
                    pass
            try:
                tls.close()
            except OSError:
                pass

    def _one_request(self, reader, writer) -> bool:
        line = reader.readline(65537).decode("latin-1")
        if not line.strip():
            return False
        method, path, _ = line.split(" ", 2)
        headers = _read_headers(reader)
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.flush()
        body = _read_body(reader, headers)
        status, reason, out_headers, payload = self._forward(method, path, headers, body)
        writer.write(f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1"))
        for k, v in out_headers:
            writer.write(f"{k}: {v}\r\n".encode("latin-1"))
        writer.write(f"Content-Length: {len(payload)}\r\n\r\n".encode("latin-1"))
        if method != "HEAD":
            writer.write(payload)
        writer.flush()
        return headers.get("connection", "").lower() != "close"

    def _forward(self, method, path, headers, body):
        port = self.server.upstream
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        if method == "GET" and url.path.endswith("/storageLayout"):  # asked before a folder rename
            return 200, "OK", [("Content-Type", "application/json")], STORAGE_LAYOUT
        send = {k: v for k, v in headers.items() if k not in ("host", "transfer-encoding", "expect", "content-length", "connection", "proxy-connection")}
        if method == "POST" and query.get("uploadType") == ["media"] and not body:
            # The emulator fails on an empty media upload (TF's makedirs marker); multipart works.
            path, body, send["content-type"] = _as_multipart(url, query, send.get("content-type"))
        # Host: the emulator's own address, or it stores www.googleapis.com in each mediaLink.
        send["Host"] = f"127.0.0.1:{port}"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request(method, path, body=body if body or method in ("POST", "PUT", "PATCH") else None, headers=send)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        out = []
        for k, v in resp.getheaders():
            if k.lower() in ("transfer-encoding", "content-length", "connection"):
                continue
            if k.lower() == "location":  # an upload session: bring TF back through the tunnel
                v = v.replace(f"http://127.0.0.1:{port}", "https://www.googleapis.com")
            out.append((k, v))
        return resp.status, resp.reason, out, payload


def _read_headers(reader) -> dict:
    headers = {}
    while True:
        line = reader.readline(65537).decode("latin-1")
        if line in ("\r\n", "\n", ""):
            return headers
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()


def _read_body(reader, headers) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int(reader.readline(65537).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while reader.readline(65537) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(parts)
            parts.append(reader.read(size))
            reader.readline(65537)
    return reader.read(int(headers.get("content-length") or 0))


def _as_multipart(url, query, content_type):
    name = query.get("name", [""])[0]
    boundary = "beametlboundary"
    body = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps({'name': name})}\r\n"
        f"--{boundary}\r\nContent-Type: {content_type or 'application/octet-stream'}\r\n\r\n\r\n--{boundary}--\r\n"
    ).encode()
    rest = {k: v for k, v in query.items() if k not in ("uploadType", "name")}
    rest["uploadType"] = ["multipart"]
    return f"{url.path}?{urllib.parse.urlencode(rest, doseq=True)}", body, f"multipart/related; boundary={boundary}"


class TlsProxy(socketserver.ThreadingTCPServer):
    """An HTTPS CONNECT proxy that serves GOOGLE_HOSTS from the emulator on 127.0.0.1:upstream."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: int, cert: str, key: str):
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.upstream = upstream
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert, key)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, name="gcs-tls-proxy", daemon=True).start()


# gcp-storage-emulator serves one request at a time (http.server.HTTPServer). With SDK workers in
# processes of their own, TF's and Beam's clients in several processes then queued behind one
# slow request until TF's 61 s stall timeout, again and again (seen: a 2-worker job stuck for 10
# minutes). The same emulator on http.server's ThreadingHTTPServer serves them side by side:
# each kept-alive connection gets a thread. Its storage is not thread-safe, though (it rewrites
# one JSON of every object's metadata on each change, iterating dicts other threads change),
# and a request that raised mid-way failed an upload in CI: a resumable upload's last chunk got
# a 500, the client retried it and got 404 (the session was gone). So the threads take turns
# at the handler, one lock around each request's handling, and only the socket work overlaps.
THREADED_EMULATOR = """
import sys, threading
from http import server
server.HTTPServer = server.ThreadingHTTPServer
from gcp_storage_emulator import server as emulator
from gcp_storage_emulator.__main__ import main
lock, handle = threading.Lock(), emulator.Router.handle
def one_at_a_time(self, method):
    with lock:
        return handle(self, method)
emulator.Router.handle = one_at_a_time
sys.argv[0] = 'gcp-storage-emulator'
sys.exit(main())
"""


class GcsServer:
    """gcp-storage-emulator with bucket BUCKET, and the TLS proxy that lets TF's client reach it."""

    def __init__(self, folder: str, port: int = 0):
        self.port = port or free_port()
        self.log = open(os.path.join(folder, "gcs-emulator.log"), "wb")
        _executable("gcp-storage-emulator")  # installed, or say how
        self.proc = subprocess.Popen(
            [sys.executable, "-c", THREADED_EMULATOR, "start", "--host", "127.0.0.1", "--port", str(self.port),
             "--in-memory", "--default-bucket", BUCKET],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            _wait_for_port(self.port, self.proc, "gcp-storage-emulator")
            ca, cert, key = make_certificates(folder)
            self.proxy = TlsProxy(self.port, cert, key)
        except BaseException:
            self.close()
            raise
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {
            "STORAGE_EMULATOR_HOST": self.endpoint,  # Beam's gcsio and google-cloud-storage
            # TensorFlow's client, through the proxy:
            "https_proxy": f"http://127.0.0.1:{self.proxy.port}",
            "HTTPS_PROXY": f"http://127.0.0.1:{self.proxy.port}",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "CURL_CA_BUNDLE": ca,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
            "NO_GCE_CHECK": "true",
        }

    def _call(self, method, path, body=None, headers=None):
        req = urllib.request.Request(self.endpoint + path, data=body, method=method, headers=headers or {})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=60) as resp:
            return resp.read()

    @staticmethod
    def _split(uri):
        bucket, _, name = uri[len("gs://"):].partition("/")
        return bucket, name

    def upload(self, uri: str, data: bytes) -> None:
        bucket, name = self._split(uri)
        if data:
            q = urllib.parse.urlencode({"uploadType": "media", "name": name})
            self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{q}", data, {"Content-Type": "application/octet-stream"})
        else:  # the emulator fails on an empty media upload; an empty multipart one works
            url = urllib.parse.urlsplit(f"/upload/storage/v1/b/{bucket}/o")
            path, body, content_type = _as_multipart(url, {"name": [name]}, None)
            self._call("POST", path, body, {"Content-Type": content_type})

    def upload_tree(self, local, uri: str) -> int:
        """Every file under the local folder, as objects under uri; returns the count."""
        count = 0
        for folder, _, files in os.walk(str(local)):
            for f in files:
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, str(local)).replace(os.sep, "/")
                with open(path, "rb") as fh:
                    self.upload(f"{uri.rstrip('/')}/{rel}", fh.read())
                count += 1
        return count

    def list(self, prefix: str) -> list:
        """The gs:// URIs of every object whose name starts with the prefix."""
        bucket, name = self._split(prefix)
        out, token = [], None
        while True:
            q = {"prefix": name, "maxResults": 1000, **({"pageToken": token} if token else {})}
            doc = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(q)}"))
            out += [f"gs://{bucket}/{item['name']}" for item in doc.get("items", [])]
            token = doc.get("nextPageToken")
            if not token:
                return sorted(out)

    def read(self, uri: str) -> bytes:
        bucket, name = self._split(uri)
        return self._call("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media")

    def close(self) -> None:
        if getattr(self, "proxy", None):
            self.proxy.shutdown()
            self.proxy.server_close()
        _stop(self.proc, self.log)


class S3Server:
    """moto's standalone S3 server with bucket BUCKET, and the Beam flags that reach it."""

    KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def __init__(self, folder: str, enforce_auth: bool = False, port: int = 0):
        """enforce_auth: moto checks every request's keys against its IAM (it knows none, so all are
        denied) after the one unauthenticated call that creates the bucket."""
        self.port = port or free_port()
        self.log = open(os.path.join(folder, f"moto-{self.port}.log"), "wb")
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="1") if enforce_auth else None
        self.proc = subprocess.Popen([_executable("moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        try:
            _wait_for_port(self.port, self.proc, "moto_server")
            self.client().create_bucket(Bucket=BUCKET)
        except BaseException:
            self.close()
            raise
        # Flags, not the environment: that is how a user points Beam's S3 filesystem at a server.
        self.beam_flags = [
            f"--s3_endpoint_url={self.endpoint}", "--s3_access_key_id=testing",
            "--s3_secret_access_key=testing", "--s3_region_name=us-east-1",
        ]
        self.env = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    @staticmethod
    def _split(uri):
        bucket, _, name = uri[len("s3://"):].partition("/")
        return bucket, name

    def upload(self, uri: str, data: bytes) -> None:
        bucket, name = self._split(uri)
        self.client().put_object(Bucket=bucket, Key=name, Body=data)

    def upload_tree(self, local, uri: str) -> int:
        bucket, name = self._split(uri.rstrip("/"))
        count, client = 0, self.client()
        for folder, _, files in os.walk(str(local)):
            for f in files:
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, str(local)).replace(os.sep, "/")
                with open(path, "rb") as fh:
                    client.put_object(Bucket=bucket, Key=f"{name}/{rel}" if name else rel, Body=fh.read())
                count += 1
        return count

    def list(self, prefix: str) -> list:
        bucket, name = self._split(prefix)
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=name)
        return sorted(f"s3://{bucket}/{o['Key']}" for page in pages for o in page.get("Contents", []))

    def read(self, uri: str) -> bytes:
        bucket, name = self._split(uri)
        return self.client().get_object(Bucket=bucket, Key=name)["Body"].read()

    def download_tree(self, uri: str, local) -> int:
        """Every object under the prefix, as files under the local folder; returns the count."""
        prefix = uri.rstrip("/") + "/"
        found = self.list(prefix)
        for object_uri in found:
            path = os.path.join(str(local), object_uri[len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(self.read(object_uri))
        return len(found)

    def close(self) -> None:
        _stop(self.proc, self.log)


def main(argv=None) -> None:
    """Start both servers, optionally copy a folder into both buckets, print what to export; run until ^C."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.objstore_servers", description=main.__doc__)
    parser.add_argument("--gcs_port", type=int, default=0, help="default: a free port")
    parser.add_argument("--s3_port", type=int, default=0, help="default: a free port")
    parser.add_argument("--upload", help="a local folder, copied to gs://bkt/images/ and s3://bkt/images/")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="beam-etl-objstore-")
    gcs, s3 = GcsServer(folder, port=args.gcs_port), S3Server(folder, port=args.s3_port)
    if args.upload:
        count = gcs.upload_tree(args.upload, f"gs://{BUCKET}/images")
        s3.upload_tree(args.upload, f"s3://{BUCKET}/images")
        print(f"# copied {count} files to gs://{BUCKET}/images/ and s3://{BUCKET}/images/")
    print(f"# GCS (bucket gs://{BUCKET}): Beam needs only STORAGE_EMULATOR_HOST; the rest is for TensorFlow")
    for k, v in gcs.env.items():
        print(f"export {k}={v}")
    print(f"# S3 (bucket s3://{BUCKET}): add these flags to beam-etl commands")
    print(" ".join(s3.beam_flags), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        gcs.close()
        s3.close()


if __name__ == "__main__":
    main()
