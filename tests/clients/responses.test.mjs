// OpenAI's Responses API through the official `openai` npm client, unchanged, against
// `steward serve -m` on a real trained model (TinyStories-656K, F32; Qwen2.5's template), and for
// function tools a synthetic pool with Hermes 3's template (lib/tool_pool.mjs): create, stream, a
// function tool, previous_response_id, retrieve, refusals.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, realModel, chatTemplate } from './lib/server.mjs';
import { toolPoolArgs, TOOL_POOL } from './lib/tool_pool.mjs';

const MODEL = 'tinystories';
let server, client, toolServer, tools;

const WEATHER = {
  type: 'function', name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] },
};

before(async () => {
  server = await startServer(['-m', realModel, '--alias', MODEL, '-np', '4',
                              '--chat-template-file', chatTemplate('Qwen-Qwen2.5-7B-Instruct.jinja')]);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
  toolServer = await startServer(toolPoolArgs());
  tools = new OpenAI({ baseURL: toolServer.baseURL, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server?.stop(); await toolServer?.stop(); });

test('create: a Response whose text is the chat completion of the same turn', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Once upon a time', instructions: 'Tell a story.',
                                            max_output_tokens: 24, temperature: 0, metadata: { run: 'ci' } });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.model, MODEL);
  assert.ok(['completed', 'incomplete'].includes(r.status));
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.deepEqual(r.metadata, { run: 'ci' });
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].content[0].type, 'output_text');
  assert.ok(r.output_text.length > 0);
  assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 24);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  const chat = await client.chat.completions.create({
    model: MODEL, max_tokens: 24, temperature: 0,
    messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }] });
  assert.equal(r.output_text, chat.choices[0].message.content);  // the same request core
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
});

test('stream: the SDK accumulates the events into the same Response', async () => {
  const body = { model: MODEL, input: 'The little dog', max_output_tokens: 20, temperature: 0, store: false };
  const whole = await client.responses.create(body);
  const stream = client.responses.stream(body);
  const types = [];
  let deltas = '';
  for await (const e of stream) {
    types.push(e.type);
    assert.equal(e.sequence_number, types.length - 1);
    if (e.type === 'response.output_text.delta') deltas += e.delta;
  }
  const final = await stream.finalResponse();
  assert.deepEqual(types.slice(0, 4),
                   ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  assert.ok(types.includes('response.output_text.delta'));
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done',
                                     final.status === 'incomplete' ? 'response.incomplete' : 'response.completed']);
  assert.equal(deltas, whole.output_text);
  assert.equal(final.output_text, whole.output_text);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
});

test('function tool: a function_call item, answered with its output', async () => {
  const r = await tools.responses.create({ model: TOOL_POOL, input: 'What is the weather in Paris?', tools: [WEATHER],
                                            tool_choice: 'required', max_output_tokens: 300, temperature: 0 });
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  assert.equal(calls[0].name, 'get_weather');
  assert.match(calls[0].call_id, /^call_/);
  assert.equal(typeof JSON.parse(calls[0].arguments).city, 'string');
  // The tool's output continues the stored conversation.
  const next = await tools.responses.create({
    model: TOOL_POOL, previous_response_id: r.id, tools: [WEATHER], max_output_tokens: 16, temperature: 0,
    input: [{ type: 'function_call_output', call_id: calls[0].call_id, output: 'sunny' }] });
  assert.equal(next.previous_response_id, r.id);
  assert.ok(next.usage.input_tokens > r.usage.input_tokens);
  // Streamed, the call comes as its own item with its arguments.
  const stream = tools.responses.stream({ model: TOOL_POOL, input: 'Weather in Rome?', tools: [WEATHER],
                                           tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 300 });
  const done = [];
  stream.on('response.function_call_arguments.done', (e) => done.push(e));
  const final = await stream.finalResponse();
  assert.equal(done.length, 1);
  const item = final.output.find((o) => o.type === 'function_call');
  assert.equal(item.arguments, done[0].arguments);
  assert.equal(typeof JSON.parse(item.arguments).city, 'string');
});

test('previous_response_id: the conversation continues, its KV warm', async () => {
  const first = await client.responses.create({ model: MODEL, input: 'Once upon a time there was a girl named Lily.',
                                                max_output_tokens: 16, temperature: 0 });
  const second = await client.responses.create({ model: MODEL, previous_response_id: first.id, input: 'What did she do?',
                                                 max_output_tokens: 16, temperature: 0 });
  assert.equal(second.previous_response_id, first.id);
  // The second turn's prompt holds the first's input and output: more tokens, most of them cached.
  assert.ok(second.usage.input_tokens > first.usage.input_tokens);
  assert.ok(second.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(second.usage));
  const got = await client.responses.retrieve(first.id);
  assert.equal(got.id, first.id);
  assert.equal(got.output_text, first.output_text);
  await assert.rejects(
    client.responses.create({ model: MODEL, previous_response_id: 'resp_nope', input: 'x' }),
    (e) => e.status === 404 && e.code === 'previous_response_not_found' && e.message.includes('resp_nope'));
  // store: false keeps nothing to continue.
  const unstored = await client.responses.create({ model: MODEL, input: 'x', store: false, max_output_tokens: 4 });
  await assert.rejects(client.responses.create({ model: MODEL, previous_response_id: unstored.id, input: 'y' }),
                       (e) => e.status === 404);
});

test('refusals name what is not served', async () => {
  await assert.rejects(client.responses.create({ model: MODEL, input: 'x', tools: [{ type: 'web_search' }] }),
                       (e) => e.status === 400 && e.param === 'tools[0].type' && e.message.includes('web_search'));
  await assert.rejects(
    client.responses.create({ model: MODEL, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }),
    (e) => e.status === 400 && e.param === 'input[0].content[0].type');
  await assert.rejects(client.responses.create({ model: 'no-such-model', input: 'x' }),
                       (e) => e.status === 404 && e.code === 'model_not_found');
});
