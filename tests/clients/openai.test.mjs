// The official `openai` npm client, unchanged, against `steward serve -m` on a real trained model
// (TinyStories-656K, F32). Greedy text is checked against llama.cpp's greedy ids for the same
// prompts (shared testdata real/greedy.tsv), detokenized by the server's /detokenize.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, realModel, testdata, chatTemplate } from './lib/server.mjs';

const MODEL = 'tinystories';
let server, client;

// llama.cpp's greedy continuations of the F32 model: [{prompt, ids}].
const greedy = readFileSync(path.join(testdata, 'real', 'greedy.tsv'), 'utf8').trim().split('\n')
  .map((l) => l.split('\t'))
  .filter((f) => f[0] === 'TinyStories-656K.f32.gguf')
  .map((f) => ({ prompt: f[1], ids: f[3].split(' ').map(Number) }));

async function detokenize(ids) {
  const r = await fetch(server.url + '/detokenize', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, tokens: ids }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).content;
}

before(async () => {
  server = await startServer(['-m', realModel, '--alias', MODEL, '-np', '4',
                              '--chat-template-file', chatTemplate('Qwen-Qwen2.5-7B-Instruct.jinja')]);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server?.stop(); });

test('models: pools first, retrieve by id, unknown is 404', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.equal(ids[0], MODEL);
  assert.equal(list.data[0].steward_kind, 'pool');
  assert.equal(list.data[0].max_model_len, 512);
  assert.ok(ids.includes('steward'));
  const one = await client.models.retrieve(MODEL);
  assert.equal(one.id, MODEL);
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => e.status === 404 && e.code === 'model_not_found');
});

test('completions: greedy text equals llama.cpp greedy ids', async () => {
  for (const g of greedy) {
    const r = await client.completions.create({ model: MODEL, prompt: g.prompt, max_tokens: 32, temperature: 0 });
    assert.equal(r.model, MODEL);
    assert.equal(r.choices[0].text, await detokenize(g.ids), g.prompt);
    assert.equal(r.usage.completion_tokens, 32);
  }
});

test('completions: a prompt array answers each prompt', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: greedy.map((g) => g.prompt), max_tokens: 32,
                                               temperature: 0, n: 2 });
  assert.equal(r.choices.length, greedy.length * 2);
  for (let p = 0; p < greedy.length; p++) {
    const want = await detokenize(greedy[p].ids);
    for (let k = 0; k < 2; k++) {
      const c = r.choices.find((c) => c.index === p * 2 + k);
      assert.ok(c, `choice ${p * 2 + k}`);
      assert.equal(c.text, want, `prompt ${p} choice ${k}`);
    }
  }
  assert.equal(r.usage.completion_tokens, greedy.length * 2 * 32);
});

test('completions: streamed logprobs cover the streamed text', async () => {
  const g = greedy[0];
  const stream = await client.completions.create({ model: MODEL, prompt: g.prompt, max_tokens: 32, temperature: 0,
                                                    logprobs: 2, stream: true });
  let text = '', tokens = [], lps = [], offsets = [];
  for await (const chunk of stream) {
    assert.equal(chunk.model, MODEL);
    const c = chunk.choices[0];
    text += c.text;
    if (c.logprobs) {
      tokens.push(...c.logprobs.tokens);
      lps.push(...c.logprobs.token_logprobs);
      offsets.push(...c.logprobs.text_offset);
      for (const top of c.logprobs.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2);
    }
  }
  assert.equal(text, await detokenize(g.ids));
  assert.equal(tokens.length, 32);
  assert.equal(tokens.join(''), text);
  for (const lp of lps) assert.ok(lp <= 0 && lp > -100);
  for (let i = 1; i < offsets.length; i++) assert.equal(offsets[i], offsets[i - 1] + Buffer.byteLength(tokens[i - 1]));
});

test('chat: answer, stream with usage and logprobs, model field as asked', async () => {
  const messages = [{ role: 'user', content: 'Tell me a story.' }];
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, temperature: 0 });
  assert.equal(r.model, MODEL);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.usage.completion_tokens, 16);
  const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, temperature: 0, stream: true,
                                                        stream_options: { include_usage: true }, logprobs: true, top_logprobs: 3 });
  let content = '', entries = [], usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.model, MODEL);
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta?.content ?? '';
    if (c.logprobs?.content) entries.push(...c.logprobs.content);
  }
  assert.equal(content, r.choices[0].message.content);
  assert.equal(usage.completion_tokens, 16);
  assert.equal(entries.length, 16);
  assert.equal(entries.map((e) => e.token).join(''), content);
  for (const e of entries) {
    assert.equal(e.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely one, and the alternatives come in order.
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    for (let i = 1; i < 3; i++) assert.ok(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob);
  }
});

test('max_tokens omitted: the rest of the context', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: greedy[0].prompt, temperature: 0, ignore_eos: true });
  assert.equal(r.usage.prompt_tokens + r.usage.completion_tokens, 512);
  assert.equal(r.choices[0].finish_reason, 'length');
});

test('context overflow: context_length_exceeded naming both numbers', async () => {
  await assert.rejects(
    client.completions.create({ model: MODEL, prompt: greedy[0].prompt, max_tokens: 510 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && /\b6\b/.test(e.message) && /\b510\b/.test(e.message) &&
           /\b512\b/.test(e.message));
});
