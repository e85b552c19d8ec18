// Anthropic's Messages API through the official `@anthropic-ai/sdk` npm client, unchanged, against
// `steward serve -m` on a real trained model (TinyStories-656K, F32; Qwen2.5's template), and for
// tools a synthetic pool with Hermes 3's template (lib/tool_pool.mjs): text, stop sequences,
// tools, streaming, and one raw-fetch check of the SSE wire (event lines and their order), of the
// error shape and of x-api-key.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, realModel, chatTemplate } from './lib/server.mjs';
import { toolPoolArgs, TOOL_POOL } from './lib/tool_pool.mjs';

const MODEL = 'tinystories';
const KEY = 'sk-steward-test';
let server, client, toolServer, tools;

const WEATHER = {
  name: 'get_weather', description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] },
};

before(async () => {
  server = await startServer(['-m', realModel, '--alias', MODEL, '-np', '4', '--api-key', KEY,
                              '--chat-template-file', chatTemplate('Qwen-Qwen2.5-7B-Instruct.jinja')]);
  client = new Anthropic({ baseURL: server.url, apiKey: KEY, maxRetries: 0 });  // sends x-api-key
  toolServer = await startServer(toolPoolArgs());
  tools = new Anthropic({ baseURL: toolServer.url, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server?.stop(); await toolServer?.stop(); });

const ask = { model: MODEL, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Once upon a time' }] };

test('text: a Message, the same text as the chat completion', async () => {
  const m = await client.messages.create({ ...ask, system: 'Tell a story.' });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, MODEL);
  assert.equal(m.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 24);
  const chat = await fetch(server.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: MODEL, max_tokens: 24, temperature: 0,
                           messages: [{ role: 'system', content: 'Tell a story.' }, ...ask.messages] }) }).then((r) => r.json());
  assert.equal(m.content[0].text, chat.choices[0].message.content);
  // input_tokens counts what was not read from the cache, as Anthropic's does.
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, chat.usage.prompt_tokens);
});

test('stop_sequences: the output ends before one, and says which', async () => {
  const whole = await client.messages.create(ask);
  const words = whole.content[0].text.trim().split(/\s+/);
  assert.ok(words.length >= 4, whole.content[0].text);
  const stop = ' ' + words[2];
  const m = await client.messages.create({ ...ask, stop_sequences: ['zzqx', stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content[0].text, whole.content[0].text.slice(0, whole.content[0].text.indexOf(stop)));
});

test('tools: a tool_use block, then its tool_result', async () => {
  const m = await tools.messages.create({ model: TOOL_POOL, max_tokens: 300, temperature: 0, tools: [WEATHER],
                                           tool_choice: { type: 'any' },
                                           messages: [{ role: 'user', content: 'What is the weather in Paris?' }] });
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(m.content));
  assert.match(use.id, /^toolu_/);
  assert.equal(use.name, 'get_weather');
  assert.equal(typeof use.input.city, 'string');
  const next = await tools.messages.create({
    model: TOOL_POOL, max_tokens: 16, temperature: 0, tools: [WEATHER],
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }, { role: 'assistant', content: m.content },
               { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] }] });
  assert.equal(next.type, 'message');
  // Streamed, the SDK rebuilds the same block from input_json_delta.
  const stream = tools.messages.stream({ model: TOOL_POOL, max_tokens: 300, tools: [WEATHER],
                                          tool_choice: { type: 'tool', name: 'get_weather' },
                                          messages: [{ role: 'user', content: 'Weather in Rome?' }] });
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  const block = final.content.find((b) => b.type === 'tool_use');
  assert.equal(block.name, 'get_weather');
  assert.equal(typeof block.input.city, 'string');
});

test('stream: the SDK rebuilds the non-streamed Message', async () => {
  const whole = await client.messages.create(ask);
  const stream = client.messages.stream(ask);
  let text = '';
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(text, whole.content[0].text);
  assert.equal(final.content[0].text, whole.content[0].text);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(final.usage.input_tokens, whole.usage.input_tokens);
});

test('wire: event lines in order, errors in Anthropic shape, x-api-key', async () => {
  const post = (body, headers = {}) => fetch(server.url + '/v1/messages', {
    method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01', ...headers },
    body: JSON.stringify(body) });
  const r = await post({ ...ask, stream: true });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const events = (await r.text()).trim().split('\n\n').map((block) => {
    const lines = block.split('\n');
    assert.match(lines[0], /^event: /);
    assert.match(lines[1], /^data: /);
    const data = JSON.parse(lines[1].slice(6));
    assert.equal(data.type, lines[0].slice(7));  // the event line names the data's type
    return data;
  });
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 3), ['message_start', 'content_block_start', 'ping']);
  assert.ok(types.slice(3, -3).every((t) => t === 'content_block_delta'));
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(events[0].message.role, 'assistant');
  assert.deepEqual(events[1].content_block, { type: 'text', text: '' });
  assert.equal(events[3].delta.type, 'text_delta');
  assert.ok(['end_turn', 'max_tokens'].includes(events.at(-2).delta.stop_reason));

  const missing = await post({ model: MODEL, messages: ask.messages });
  assert.equal(missing.status, 400);
  const body = await missing.json();
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, /max_tokens/);
  const unknown = await post({ ...ask, model: 'claude-nope' });
  assert.equal(unknown.status, 404);
  assert.equal((await unknown.json()).error.type, 'not_found_error');
  const denied = await post(ask, { 'x-api-key': 'wrong' });
  assert.equal(denied.status, 401);
  assert.equal((await denied.json()).error.type, 'authentication_error');
  await assert.rejects(new Anthropic({ baseURL: server.url, apiKey: 'wrong', maxRetries: 0 }).messages.create(ask),
                       (e) => e.status === 401);
});
