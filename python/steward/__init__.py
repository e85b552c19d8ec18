"""Steward from Python: the C API (steward/steward.h, libsteward.so) through ctypes, no build step.

    import steward
    rt = steward.Runtime("configs/test_tiny.toml")
    r = rt.generate("Once upon a time", max_tokens=16, stop=["."])
    print(r.text, r.finish_reason, r.usage.completion_tokens)
    for piece in rt.stream("Once upon a time", max_tokens=16):
        print(piece, end="", flush=True)
    vec = rt.embed("Once upon a time")       # a unit-length list of floats
    rt.close()

libsteward.so is found, in order: $STEWARD_LIB (the library's path), the install tree this package
was installed into (cmake --install), $STEWARD_BUILD_DIR (a build directory), then the dynamic
loader's search path. A failure is a StewardError (or a subclass) carrying the C API's message.
Thread-safety: a Runtime may be used from several threads at once, except close().
"""
import ctypes
import json
import os
import queue
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, byref, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_size_t, c_uint64, c_void_p)

__all__ = ["Runtime", "Result", "Usage", "TokenLogprob", "StewardError", "InvalidArgumentError", "ConfigError",
           "OverloadedError", "TimeoutError", "CancelledError", "GenerationError", "check_config", "library_path"]

API_VERSION = 3  # the steward.h this module mirrors (STEWARD_API_VERSION)

# ---- errors: one class per steward_status


class StewardError(Exception):
    """A C API call failed: .status (the steward_status number), .status_name, .message, and for a
    finished request .result (what it produced before failing)."""

    def __init__(self, status, message, result=None):
        self.status = status
        self.status_name = _status_name(status)
        self.message = message
        self.result = result
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)


class InvalidArgumentError(StewardError, ValueError):
    pass


class ConfigError(StewardError):
    pass


class OverloadedError(StewardError):
    pass


class TimeoutError(StewardError):  # noqa: A001 (steward.TimeoutError, the request passed its deadline)
    pass


class CancelledError(StewardError):
    pass


class GenerationError(StewardError):
    pass


_ERRORS = {1: InvalidArgumentError, 2: ConfigError, 3: OverloadedError, 4: TimeoutError, 5: CancelledError,
           6: GenerationError}

# ---- the C structs (steward.h, API 3), field for field


class _Request(Structure):
    _fields_ = [("prompt", c_char_p), ("prompt_ids", POINTER(c_int32)), ("n_prompt_ids", c_size_t),
                ("tenant", c_char_p), ("session", c_char_p), ("bucket_hint", c_char_p),
                ("response_format", c_char_p), ("max_tokens", c_int32), ("temperature", c_float),
                ("top_p", c_float), ("top_k", c_int32), ("seed", c_uint64), ("tools", c_int), ("add_bos", c_int),
                ("ignore_eos", c_int)]


class _LogitBias(Structure):
    _fields_ = [("id", c_int32), ("bias", c_float)]


class _RequestExt(Structure):
    _fields_ = [("size", c_size_t), ("stop", POINTER(c_char_p)), ("n_stop", c_size_t), ("grammar", c_char_p),
                ("json_schema", c_char_p), ("json_object", c_int), ("top_logprobs", c_int32), ("pool", c_char_p),
                ("logit_bias", POINTER(_LogitBias)), ("n_logit_bias", c_size_t), ("presence_penalty", c_float),
                ("frequency_penalty", c_float), ("parse_special", c_int),
                ("on_logprobs", c_void_p)]  # a steward_logprobs_cb; this module leaves it NULL


class _Metrics(Structure):
    _fields_ = [("ttft_ms", c_double), ("e2e_ms", c_double), ("queue_ms", c_double), ("tpot_ms", c_double),
                ("prompt_tokens", c_int32), ("cached_tokens", c_int32), ("completion_tokens", c_int32),
                ("recomputed_tokens", c_int32), ("cost", c_double), ("config_generation", c_uint64)]


class _TokenLogprob(Structure):
    _fields_ = [("id", c_int32), ("logprob", c_float)]


class _TopLogprobs(Structure):
    _fields_ = [("items", POINTER(_TokenLogprob)), ("n_items", c_size_t)]


class _Result(Structure):
    _fields_ = [("handle", c_uint64), ("status", c_int), ("finish_reason", c_char_p), ("error", c_char_p),
                ("text", POINTER(c_char)), ("text_len", c_size_t), ("tokens", POINTER(c_int32)),
                ("logprobs", POINTER(c_float)), ("n_tokens", c_size_t), ("bucket", c_char_p), ("pool", c_char_p),
                ("metrics", _Metrics), ("finish", c_int), ("upgraded", c_int), ("fallback", c_int),
                ("top_logprobs", POINTER(_TopLogprobs)), ("n_top_logprobs", c_size_t)]


_TOKEN_CB = CFUNCTYPE(None, POINTER(c_char), c_size_t, POINTER(c_int32), c_size_t, c_void_p)
_FINISH_CB = CFUNCTYPE(None, POINTER(_Result), c_void_p)

# ---- finding and binding the library


def _candidates():
    env = os.environ.get("STEWARD_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from . import _install  # written by cmake --install: where libsteward is relative to this package
        yield os.path.normpath(os.path.join(here, _install.LIBDIR_FROM_PACKAGE, "libsteward.so"))
    except ImportError:
        pass
    build = os.environ.get("STEWARD_BUILD_DIR")
    if build:
        yield os.path.join(build, "libsteward.so")
    yield os.path.normpath(os.path.join(here, "..", "..", "build", "libsteward.so"))  # a checkout's default build
    yield "libsteward.so"


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("steward: cannot load libsteward.so; set STEWARD_LIB to its path or STEWARD_BUILD_DIR to a "
                      "build directory. Tried: " + "; ".join(tried))


_lib, library_path = _load()


def _bind(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_c = type("_C", (), {})()
_c.status_name = _bind("steward_status_name", c_char_p, c_int)
_c.api_version = _bind("steward_api_version", c_int)
if _c.api_version() < API_VERSION:
    raise ImportError(f"steward: {library_path} has C API version {_c.api_version()}; this module needs "
                      f"{API_VERSION} or later")
_c.request_default = _bind("steward_request_default", _Request)
_c.request_ext_default = _bind("steward_request_ext_default", _RequestExt)
_c.runtime_start = _bind("steward_runtime_start", c_int, c_char_p, POINTER(c_void_p), c_char_p, c_size_t)
_c.runtime_free = _bind("steward_runtime_free", None, c_void_p)
_c.check_config = _bind("steward_check_config", c_int, c_char_p, POINTER(c_void_p), c_char_p, c_size_t)
_c.submit_ext = _bind("steward_submit_ext", c_int, c_void_p, POINTER(_Request), POINTER(_RequestExt), _TOKEN_CB,
                      _FINISH_CB, c_void_p, POINTER(c_uint64), c_char_p, c_size_t)
_c.cancel = _bind("steward_cancel", c_int, c_void_p, c_uint64)
_c.end_session = _bind("steward_end_session", c_int, c_void_p, c_char_p)
_c.drain = _bind("steward_drain", c_int, c_void_p)
_c.reload = _bind("steward_reload", c_int, c_void_p, POINTER(c_uint64), c_char_p, c_size_t)
_c.config_generation = _bind("steward_config_generation", c_int, c_void_p, POINTER(c_uint64))
_c.metrics_json = _bind("steward_metrics_json", c_int, c_void_p, POINTER(c_void_p))
_c.metrics_prometheus = _bind("steward_metrics_prometheus", c_int, c_void_p, POINTER(c_void_p))
_c.tokenize = _bind("steward_tokenize", c_int, c_void_p, c_char_p, c_char_p, c_int, POINTER(POINTER(c_int32)),
                    POINTER(c_size_t), c_char_p, c_size_t)
_c.detokenize = _bind("steward_detokenize", c_int, c_void_p, c_char_p, POINTER(c_int32), c_size_t,
                      POINTER(c_void_p), POINTER(c_size_t), c_char_p, c_size_t)
_c.ids_free = _bind("steward_ids_free", None, POINTER(c_int32))
_c.embed = _bind("steward_embed", c_int, c_void_p, c_char_p, POINTER(c_char_p), c_size_t, POINTER(POINTER(c_float)),
                 POINTER(c_size_t), POINTER(ctypes.c_int64), c_char_p, c_size_t)
_c.floats_free = _bind("steward_floats_free", None, POINTER(c_float))
_c.string_free = _bind("steward_string_free", None, c_void_p)

if _c.request_ext_default().size != ctypes.sizeof(_RequestExt):
    raise ImportError(f"steward: {library_path}'s steward_request_ext is {_c.request_ext_default().size} bytes, this "
                      f"module's {ctypes.sizeof(_RequestExt)}: the module and the library are of different versions")


def _status_name(status):
    return _c.status_name(status).decode()


def _raise(status, message, result=None):
    raise _ERRORS.get(status, StewardError)(status, message, result)


def _take_string(p, n=None):
    """A string the C API returned (malloc'ed): its text, freed."""
    if not p.value:
        return ""
    try:
        raw = ctypes.string_at(p.value, n) if n is not None else ctypes.string_at(p.value)
        return raw.decode("utf-8", errors="replace")
    finally:
        _c.string_free(p)


_ERR_LEN = 2048

# ---- results


class Usage:
    """A request's figures (steward_request_metrics; docs/metrics.md)."""

    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens", "recomputed_tokens", "ttft_ms", "e2e_ms",
                 "queue_ms", "tpot_ms", "cost", "config_generation")

    def __init__(self, m):
        for name in self.__slots__:
            setattr(self, name, getattr(m, name))

    @property
    def total_tokens(self):
        return self.prompt_tokens + self.completion_tokens

    def __repr__(self):
        return "Usage(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"


class TokenLogprob:
    """One alternative for an output position: a token id and its log-probability."""

    __slots__ = ("id", "logprob")

    def __init__(self, id, logprob):  # noqa: A002
        self.id, self.logprob = id, logprob

    def __repr__(self):
        return f"TokenLogprob(id={self.id}, logprob={self.logprob:.4f})"


class Result:
    """A finished request (a copy of steward_result): text, tokens, logprobs (one per token),
    top_logprobs (per token, a list of TokenLogprob, most likely first; [] unless asked),
    finish_reason ("stop", "length", ...), error, bucket, pool, usage (Usage), upgraded, fallback."""

    def __init__(self, r):
        self.handle = r.handle
        self.status = r.status
        self.finish_reason = r.finish_reason.decode()
        self.error = r.error.decode("utf-8", errors="replace")
        self.text = ctypes.string_at(r.text, r.text_len).decode("utf-8", errors="replace") if r.text_len else ""
        n = r.n_tokens
        self.tokens = list(r.tokens[:n]) if n else []
        self.logprobs = list(r.logprobs[:n]) if n else []
        self.top_logprobs = [[TokenLogprob(t.id, t.logprob) for t in r.top_logprobs[i].items[:r.top_logprobs[i].n_items]]
                             for i in range(r.n_top_logprobs)]
        self.bucket = r.bucket.decode()
        self.pool = r.pool.decode()
        self.usage = Usage(r.metrics)
        self.upgraded = bool(r.upgraded)
        self.fallback = bool(r.fallback)

    @property
    def ok(self):
        return self.status == 0

    def __repr__(self):
        return (f"Result(text={self.text!r}, finish_reason={self.finish_reason!r}, pool={self.pool!r}, "
                f"n_tokens={len(self.tokens)}, usage={self.usage!r})")


# ---- requests in flight: the C callbacks are two module-level thunks (they outlive every request);
# `user` is a key into _pending, whose entry takes the request's pieces and its result.

_pending = {}
_pending_lock = threading.Lock()
_next_key = [1]


class _InFlight:
    def __init__(self, streaming):
        self.queue = queue.Queue() if streaming else None
        self.done = threading.Event()
        self.result = None
        self.handle = 0


def _on_token(piece, piece_len, ids, n_ids, user):
    with _pending_lock:
        req = _pending.get(user)
    if req is not None and req.queue is not None:
        req.queue.put(ctypes.string_at(piece, piece_len).decode("utf-8", errors="replace"))


def _on_finish(result, user):
    with _pending_lock:
        req = _pending.pop(user, None)
    if req is None:
        return
    try:
        req.result = Result(result.contents)
    except Exception as e:  # never unwind into C: the waiter sees the failure instead
        req.result = e
    req.done.set()
    if req.queue is not None:
        req.queue.put(None)


_token_thunk = _TOKEN_CB(_on_token)
_finish_thunk = _FINISH_CB(_on_finish)


def _encode(s, what):
    if s is None:
        return None
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a str, not {type(s).__name__}")
    return s.encode("utf-8")


class _Args:
    """A request's C structs and the buffers they point into (kept alive through the submit call)."""

    def __init__(self, prompt, *, max_tokens=0, temperature=0.0, top_p=1.0, top_k=0, seed=0, stop=None,
                 grammar=None, json_schema=None, json_object=False, top_logprobs=0, pool=None, logit_bias=None,
                 presence_penalty=0.0, frequency_penalty=0.0, session=None, tenant=None, bucket_hint=None,
                 response_format=None, tools=False, add_bos=True, ignore_eos=False, parse_special=False):
        req = _c.request_default()
        if isinstance(prompt, str):
            self._prompt = prompt.encode("utf-8")
            req.prompt = self._prompt
        else:
            ids = list(prompt)
            if not ids:
                raise InvalidArgumentError(1, "prompt is an empty list of token ids")
            self._ids = (c_int32 * len(ids))(*ids)
            req.prompt_ids = self._ids
            req.n_prompt_ids = len(ids)
        self._strings = [_encode(tenant, "tenant"), _encode(session, "session"), _encode(bucket_hint, "bucket_hint"),
                         _encode(response_format, "response_format")]
        req.tenant, req.session, req.bucket_hint, req.response_format = self._strings
        req.max_tokens = max_tokens
        req.temperature = temperature
        req.top_p = top_p
        req.top_k = top_k
        req.seed = seed
        req.tools = int(bool(tools))
        req.add_bos = int(bool(add_bos))
        req.ignore_eos = int(bool(ignore_eos))
        ext = _c.request_ext_default()
        if stop:
            stops = [stop] if isinstance(stop, str) else list(stop)
            self._stop_bytes = [_encode(s, "a stop string") for s in stops]
            self._stop = (c_char_p * len(stops))(*self._stop_bytes)
            ext.stop = self._stop
            ext.n_stop = len(stops)
        if json_schema is not None and not isinstance(json_schema, str):
            json_schema = json.dumps(json_schema)
        self._more = [_encode(grammar, "grammar"), _encode(json_schema, "json_schema"), _encode(pool, "pool")]
        ext.grammar, ext.json_schema, ext.pool = self._more
        ext.json_object = int(bool(json_object))
        ext.top_logprobs = top_logprobs
        if logit_bias:
            items = list(logit_bias.items())
            self._bias = (_LogitBias * len(items))(*[_LogitBias(int(k), float(v)) for k, v in items])
            ext.logit_bias = self._bias
            ext.n_logit_bias = len(items)
        ext.presence_penalty = presence_penalty
        ext.frequency_penalty = frequency_penalty
        ext.parse_special = int(bool(parse_special))
        self.req, self.ext = req, ext


class Runtime:
    """A running Steward (steward_runtime_start): its pools, actors and config. Close it with close()
    or use it as a context manager. Request keywords (generate, stream, submit): max_tokens (0: the
    config's default), temperature (0: greedy), top_p, top_k, seed, stop (a str or a list of up to
    16), grammar (GBNF), json_schema (a dict or JSON text), json_object, top_logprobs (0-20), pool,
    logit_bias ({id: bias}), presence_penalty, frequency_penalty, session, tenant, bucket_hint,
    response_format, tools, add_bos, ignore_eos, parse_special. The prompt is a str or a list of token ids."""

    def __init__(self, config_path):
        err = ctypes.create_string_buffer(_ERR_LEN)
        handle = c_void_p()
        status = _c.runtime_start(os.fspath(config_path).encode(), byref(handle), err, _ERR_LEN)
        if status != 0:
            _raise(status, err.value.decode("utf-8", errors="replace"))
        self._rt = handle

    def close(self):
        """Cancels what still runs (each finishes "cancelled"), stops and frees the runtime. Idempotent;
        must not run concurrently with another call on this runtime."""
        rt, self._rt = getattr(self, "_rt", None), None
        if rt:
            _c.runtime_free(rt)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the module's globals may be gone already
            pass

    def _handle(self):
        if not self._rt:
            raise StewardError(1, "the runtime is closed")
        return self._rt

    def _submit(self, prompt, streaming, kwargs):
        args = _Args(prompt, **kwargs)
        flight = _InFlight(streaming)
        with _pending_lock:
            key = _next_key[0]
            _next_key[0] += 1
            _pending[key] = flight
        err = ctypes.create_string_buffer(_ERR_LEN)
        handle = c_uint64()
        status = _c.submit_ext(self._handle(), byref(args.req), byref(args.ext), _token_thunk, _finish_thunk,
                               c_void_p(key), byref(handle), err, _ERR_LEN)
        if status != 0:
            with _pending_lock:
                _pending.pop(key, None)
            _raise(status, err.value.decode("utf-8", errors="replace"))
        flight.handle = handle.value
        return flight

    @staticmethod
    def _finished(flight):
        r = flight.result
        if isinstance(r, Exception):
            raise StewardError(9, f"reading the result failed: {r}")
        if not r.ok:
            _raise(r.status, r.error or r.finish_reason, r)
        return r

    def generate(self, prompt, **kwargs):
        """Generates and waits: a Result. A request that fails (overloaded, timeout, cancelled, an
        error) raises the matching StewardError, whose .result holds what it produced."""
        flight = self._submit(prompt, False, kwargs)
        flight.done.wait()
        return self._finished(flight)

    def stream(self, prompt, **kwargs):
        """A generator of text pieces (complete UTF-8 characters) as they are produced; its
        .result is not needed: the last piece is followed by StopIteration, or by the request's
        StewardError. Stopping early (break, close(), garbage collection) cancels the request."""
        flight = self._submit(prompt, True, kwargs)
        try:
            while True:
                piece = flight.queue.get()
                if piece is None:
                    break
                yield piece
            self._finished(flight)
        finally:
            if not flight.done.is_set():
                _c.cancel(self._rt, flight.handle)
                flight.done.wait(60)

    def submit(self, prompt, **kwargs):
        """Submits and returns at once: a Request (wait(), cancel(), handle)."""
        return Request(self, self._submit(prompt, False, kwargs))

    def cancel(self, handle):
        """Cancels a running request by handle; False when it already finished or is unknown."""
        return _c.cancel(self._handle(), handle) == 0

    def end_session(self, session):
        """Drops a session's pinned KV now (otherwise it expires after limits.session_ttl_ms)."""
        status = _c.end_session(self._handle(), _encode(session, "session"))
        if status != 0:
            _raise(status, f"end_session({session!r}) failed")

    def drain(self):
        """Waits until no request is in flight."""
        status = _c.drain(self._handle())
        if status != 0:
            _raise(status, "drain failed")

    def reload(self):
        """Re-reads the config file and swaps it in: the new generation, or ConfigError (nothing changed)."""
        err = ctypes.create_string_buffer(_ERR_LEN)
        gen = c_uint64()
        status = _c.reload(self._handle(), byref(gen), err, _ERR_LEN)
        if status != 0:
            _raise(status, err.value.decode("utf-8", errors="replace"))
        return gen.value

    @property
    def config_generation(self):
        gen = c_uint64()
        status = _c.config_generation(self._handle(), byref(gen))
        if status != 0:
            _raise(status, "config_generation failed")
        return gen.value

    def metrics(self):
        """The per-bucket figures so far (steward_metrics_json), parsed."""
        out = c_void_p()
        status = _c.metrics_json(self._handle(), byref(out))
        if status != 0:
            _raise(status, "metrics_json failed")
        return json.loads(_take_string(out))

    def metrics_prometheus(self):
        """The same figures in the Prometheus text exposition format."""
        out = c_void_p()
        status = _c.metrics_prometheus(self._handle(), byref(out))
        if status != 0:
            _raise(status, "metrics_prometheus failed")
        return _take_string(out)

    def tokenize(self, text, pool=None, add_special=True):
        """Text -> token ids with a pool's tokenizer (None: the config's first pool)."""
        err = ctypes.create_string_buffer(_ERR_LEN)
        ids = POINTER(c_int32)()
        n = c_size_t()
        status = _c.tokenize(self._handle(), _encode(pool, "pool"), _encode(text, "text"), int(bool(add_special)),
                             byref(ids), byref(n), err, _ERR_LEN)
        if status != 0:
            _raise(status, err.value.decode("utf-8", errors="replace"))
        try:
            return list(ids[:n.value]) if n.value else []
        finally:
            _c.ids_free(ids)

    def detokenize(self, ids, pool=None):
        """Token ids -> text with a pool's tokenizer (None: the config's first pool)."""
        ids = list(ids)
        arr = (c_int32 * max(1, len(ids)))(*ids)
        err = ctypes.create_string_buffer(_ERR_LEN)
        out = c_void_p()
        n = c_size_t()
        status = _c.detokenize(self._handle(), _encode(pool, "pool"), arr, len(ids), byref(out), byref(n), err,
                               _ERR_LEN)
        if status != 0:
            _raise(status, err.value.decode("utf-8", errors="replace"))
        return _take_string(out, n.value)


    def embed(self, texts, pool=None):
        """Unit-length embeddings (steward_embed): a list of floats for a str, a list of them for a
        list of str. pool None: the first pool that can embed. Blocks; not from another request's
        callback."""
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        if not items:
            raise InvalidArgumentError(1, "embed: no texts")
        encoded = [_encode(t, "a text") for t in items]
        arr = (c_char_p * len(encoded))(*encoded)
        err = ctypes.create_string_buffer(_ERR_LEN)
        vecs = POINTER(c_float)()
        n_embd = c_size_t()
        n_prompt = ctypes.c_int64()
        status = _c.embed(self._handle(), _encode(pool, "pool"), arr, len(encoded), byref(vecs), byref(n_embd),
                          byref(n_prompt), err, _ERR_LEN)
        if status != 0:
            _raise(status, err.value.decode("utf-8", errors="replace"))
        try:
            d = n_embd.value
            out = [vecs[i * d:(i + 1) * d] for i in range(len(items))]
        finally:
            _c.floats_free(vecs)
        return out[0] if single else out


class Request:
    """A submitted request (Runtime.submit)."""

    def __init__(self, rt, flight):
        self._rt, self._flight = rt, flight

    @property
    def handle(self):
        return self._flight.handle

    def done(self):
        return self._flight.done.is_set()

    def wait(self, timeout=None):
        """The Result, or the request's StewardError raised; None when `timeout` seconds pass first."""
        if not self._flight.done.wait(timeout):
            return None
        return Runtime._finished(self._flight)

    def cancel(self):
        return self._rt.cancel(self._flight.handle)


def check_config(config_path):
    """Validates a config file completely without serving (steward config check): its summary, or
    ConfigError naming file:line:column."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    out = c_void_p()
    status = _c.check_config(os.fspath(config_path).encode(), byref(out), err, _ERR_LEN)
    if status != 0:
        _raise(status, err.value.decode("utf-8", errors="replace"))
    return _take_string(out)
