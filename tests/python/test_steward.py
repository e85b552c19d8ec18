"""The Python module (python/steward, over the C API) on the real TinyStories model, against
llama.cpp's greedy ids (shared/testdata/real/greedy.tsv).
Run: STEWARD_LIB=build/libsteward.so PYTHONPATH=python python3 tests/python/test_steward.py
(ctest runs it as python_module with Debian's python3; STEWARD_TESTDATA defaults to ../shared/testdata)."""
import json
import os
import sys
import tempfile
import unittest

import steward

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.environ.get("STEWARD_TESTDATA", os.path.join(HERE, "..", "..", "..", "shared", "testdata"))
MODEL = os.path.join(TESTDATA, "real", "TinyStories-656K.f32.gguf")


def read_references():
    refs = []
    with open(os.path.join(TESTDATA, "real", "greedy.tsv")) as f:
        for line in f:
            file, prompt, prompt_ids, greedy = line.rstrip("\n").split("\t")
            if file == "TinyStories-656K.f32.gguf":
                refs.append((prompt, [int(t) for t in prompt_ids.split()], [int(t) for t in greedy.split()]))
    return refs


class RuntimeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.refs = read_references()
        assert len(cls.refs) == 3, cls.refs
        cls.tmp = tempfile.TemporaryDirectory(prefix="steward-python-")
        # No prefix cache: a second turn's cached tokens come from its session alone.
        cls.config = os.path.join(cls.tmp.name, "story.toml")
        with open(cls.config, "w") as f:
            f.write(f"""[limits]
request_timeout_ms = 120000
session_ttl_ms = 600000
max_tokens_default = 32

[[pool]]
name = "story"
model = "{MODEL}"
threads = 1
kv_blocks = 128
block_size = 16
max_batch = 8
max_batch_tokens = 256
prefix_cache = false
pooling = "mean"

[[bucket]]
name = "default"
pool = "story"
""")
        cls.rt = steward.Runtime(cls.config)

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()
        cls.tmp.cleanup()

    def test_greedy_text_is_llama_cpps(self):
        for prompt, prompt_ids, greedy in self.refs:
            with self.subTest(prompt=prompt):
                self.assertEqual(self.rt.tokenize(prompt), prompt_ids)
                r = self.rt.generate(prompt, max_tokens=len(greedy))
                self.assertEqual(r.tokens, greedy)
                self.assertEqual(r.text, self.rt.detokenize(greedy))
                self.assertEqual(r.finish_reason, "length")
                self.assertEqual(r.pool, "story")
                self.assertEqual(r.usage.prompt_tokens, len(prompt_ids))
                self.assertEqual(r.usage.completion_tokens, len(greedy))

    def test_streamed_pieces_concatenate_to_the_text(self):
        prompt, _, greedy = self.refs[1]
        pieces = list(self.rt.stream(prompt, max_tokens=len(greedy)))
        self.assertGreater(len(pieces), 1)
        self.assertEqual("".join(pieces), self.rt.generate(prompt, max_tokens=len(greedy)).text)
        self.assertEqual("".join(pieces), self.rt.detokenize(greedy))

    def test_stopping_a_stream_early_cancels_it(self):
        before = self.rt.metrics_prometheus()
        stream = self.rt.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()  # what garbage collection would do; returns once the request finished
        self.rt.drain()
        after = self.rt.metrics_prometheus()
        cancelled = [l for l in after.splitlines() if 'finished_reason="cancelled"' in l and not l.startswith("#")]
        self.assertTrue(cancelled, after)
        self.assertNotEqual(before, after)

    def test_a_sessions_second_turn_is_cached_and_continues_greedy(self):
        _, prompt_ids, greedy = self.refs[0]
        n1 = 12
        r1 = self.rt.generate(prompt_ids, add_bos=False, max_tokens=n1, session="py-session")
        self.assertEqual(r1.tokens, greedy[:n1])
        self.assertEqual(r1.usage.cached_tokens, 0)
        r2 = self.rt.generate(prompt_ids + r1.tokens, add_bos=False, max_tokens=8, session="py-session")
        self.assertGreaterEqual(r2.usage.cached_tokens, len(prompt_ids) + n1 - 1)
        self.assertEqual(r2.tokens, greedy[n1:n1 + 8])
        self.rt.end_session("py-session")
        r3 = self.rt.generate(prompt_ids + r1.tokens, add_bos=False, max_tokens=8, session="py-session")
        self.assertEqual(r3.usage.cached_tokens, 0)
        self.rt.end_session("py-session")

    def test_request_fields_reach_the_c_api(self):
        prompt, _, greedy = self.refs[0]
        text = self.rt.detokenize(greedy)
        stop = text[len(text) // 2:len(text) // 2 + 6]
        r = self.rt.generate(prompt, max_tokens=len(greedy), stop=[stop, "zebra-never"])
        self.assertEqual(r.text, text[:text.index(stop)])
        self.assertEqual(r.finish_reason, "stop")
        r = self.rt.generate(prompt, max_tokens=8, top_logprobs=3)
        self.assertEqual([row[0].id for row in r.top_logprobs], greedy[:8])
        self.assertTrue(all(len(row) == 3 and row[0].logprob >= row[1].logprob >= row[2].logprob for row in r.top_logprobs))
        r = self.rt.generate(prompt, max_tokens=3, logit_bias={1000: 100})
        self.assertEqual(r.tokens, [1000, 1000, 1000])
        r = self.rt.generate(prompt, max_tokens=16, json_schema={"type": "boolean"})
        self.assertIn(json.loads(r.text), (True, False))  # JSON: whitespace may follow
        r = self.rt.generate(prompt, max_tokens=16, grammar='root ::= "The " ("cat" | "dog") "."')
        self.assertIn(r.text, ("The cat.", "The dog."))

    def test_embeddings_are_llama_cpps(self):
        refs = {}
        with open(os.path.join(HERE, "..", "data", "embeddings", "llama_embedding.tsv")) as f:
            for line in f:
                file, pooling, prompt, _, vec = line.rstrip("\n").split("\t")
                if file == "TinyStories-656K.f32.gguf" and pooling == "mean":
                    refs[prompt] = [float(v) for v in vec.split()]
        prompts = list(refs)[:3]
        vecs = self.rt.embed(prompts)
        self.assertEqual(len(vecs), 3)
        for prompt, got in zip(prompts, vecs):
            want = refs[prompt]
            self.assertEqual(len(got), len(want))
            dot = sum(a * b for a, b in zip(got, want))
            cos = dot / (sum(a * a for a in got) ** 0.5 * sum(b * b for b in want) ** 0.5)
            self.assertGreaterEqual(cos, 0.9999, prompt)
        alone = self.rt.embed(prompts[0])  # a str: one vector (batched and alone agree to rounding)
        self.assertLess(max(abs(a - b) for a, b in zip(alone, vecs[0])), 1e-5)
        with self.assertRaises(steward.InvalidArgumentError) as e:
            self.rt.embed("Once", pool="nope")
        self.assertIn("nope", e.exception.message)

    def test_errors_are_exceptions_with_the_c_apis_message(self):
        with self.assertRaises(steward.ConfigError) as e:
            steward.Runtime(os.path.join(self.tmp.name, "missing.toml"))
        self.assertIn("missing.toml", str(e.exception))
        with self.assertRaises(steward.InvalidArgumentError) as e:
            self.rt.generate("Once", grammar='root ::= "unterminated')
        self.assertIn("grammar", e.exception.message.lower())
        with self.assertRaises(steward.InvalidArgumentError) as e:
            self.rt.generate("Once", top_logprobs=99)
        self.assertIn("top_logprobs", e.exception.message)
        with self.assertRaises(steward.GenerationError) as e:
            self.rt.generate("Once", pool="nope")
        self.assertIn("nope", e.exception.message)
        self.assertEqual(e.exception.result.finish_reason, "error")
        with self.assertRaises(steward.GenerationError):
            list(self.rt.stream("Once", pool="nope"))
        with self.assertRaises(steward.InvalidArgumentError):
            self.rt.tokenize("Once", pool="nope")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
