// The official `openai` npm client's client.embeddings.create, unchanged, against `steward serve -m`
// on a real trained model (TinyStories-656K, F32; its GGUF declares no pooling, so the last token's
// state): by default the client asks for base64 and decodes it itself; with encoding_format "float"
// it reads the floats. Both are checked against llama.cpp's llama-embedding vectors
// (tests/data/embeddings/llama_embedding.tsv, pooling last).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, realModel, sourceDir } from './lib/server.mjs';

const MODEL = 'tinystories';
let server, client;
const sent = [];  // the bodies the client sent to /v1/embeddings, as it sent them

// llama.cpp's unit vectors, pooling last: [{prompt, ids, vec}].
const refs = readFileSync(path.join(sourceDir, 'tests', 'data', 'embeddings', 'llama_embedding.tsv'), 'utf8').trim()
  .split('\n').map((l) => l.split('\t'))
  .filter((f) => f[0] === 'TinyStories-656K.f32.gguf' && f[1] === 'last')
  .map((f) => ({ prompt: f[2], ids: f[3].split(' ').map(Number), vec: f[4].split(' ').map(Number) }));

function cosine(a, b) {
  assert.equal(a.length, b.length);
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) { ab += a[i] * b[i]; aa += a[i] * a[i]; bb += b[i] * b[i]; }
  return ab / Math.sqrt(aa * bb);
}

before(async () => {
  server = await startServer(['-m', realModel, '--alias', MODEL]);
  const spy = async (url, init) => {
    if (String(url).endsWith('/embeddings')) sent.push(JSON.parse(init.body));
    return fetch(url, init);
  };
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, fetch: spy });
});
after(async () => { await server?.stop(); });

test('embeddings: the default base64 answer is llama.cpp\'s vectors', async () => {
  assert.equal(refs.length, 4);
  const r = await client.embeddings.create({ model: MODEL, input: refs.map((x) => x.prompt) });
  assert.equal(sent.at(-1).encoding_format, 'base64');  // the client's default, decoded by the client
  assert.equal(r.object, 'list');
  assert.equal(r.model, MODEL);
  assert.equal(r.data.length, refs.length);
  for (const [i, ref] of refs.entries()) {
    assert.equal(r.data[i].index, i);
    assert.equal(r.data[i].embedding.length, 128);
    assert.ok(cosine(r.data[i].embedding, ref.vec) >= 0.9999, ref.prompt);
  }
  const n = refs.reduce((s, x) => s + x.ids.length, 0);
  assert.equal(r.usage.prompt_tokens, n);
  assert.equal(r.usage.total_tokens, n);
});

test('embeddings: float equals base64, from text or token ids', async () => {
  const b64 = await client.embeddings.create({ model: MODEL, input: refs[1].prompt });
  const flt = await client.embeddings.create({ model: MODEL, input: refs[1].prompt, encoding_format: 'float' });
  const ids = await client.embeddings.create({ model: MODEL, input: refs[1].ids, encoding_format: 'float' });
  assert.equal(sent.at(-2).encoding_format, 'float');
  // base64 carries the float32s exactly; the floats' text parses back to the same float32s.
  assert.deepEqual(Array.from(Float32Array.from(flt.data[0].embedding)), b64.data[0].embedding);
  assert.deepEqual(ids.data[0].embedding, flt.data[0].embedding);
  assert.ok(cosine(flt.data[0].embedding, refs[1].vec) >= 0.9999);
  const routed = await client.embeddings.create({ model: 'steward', input: refs[1].prompt, encoding_format: 'float' });
  assert.equal(routed.model, 'steward');
  assert.deepEqual(routed.data[0].embedding, flt.data[0].embedding);
});

test('embeddings: refusals the client raises', async () => {
  await assert.rejects(
    client.embeddings.create({ model: MODEL, input: Array(600).fill(5) }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && /\b600\b/.test(e.message) && /\b512\b/.test(e.message));
  await assert.rejects(
    client.embeddings.create({ model: MODEL, input: 'hi', dimensions: 64 }),
    (e) => e.status === 400 && e.param === 'dimensions' && /\b64\b/.test(e.message) && /\b128\b/.test(e.message));
  await assert.rejects(client.embeddings.create({ model: 'no-such-model', input: 'hi' }),
                       (e) => e.status === 404 && e.code === 'model_not_found');
});
