// The official openai npm client against bin/k3 --serve (run by tests/t_80_server.sh with
// K3_URL and K3_KEY): a streamed chat completion, a tool-call round trip, an error, logit_bias
// and penalties.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const client = new OpenAI({ baseURL: process.env.K3_URL + '/v1', apiKey: process.env.K3_KEY, maxRetries: 0 });

// 1. streamed chat: deltas, one finish_reason, usage at the end
const stream = await client.chat.completions.create({
  model: 'k3', messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 8, stream: true,
  stream_options: { include_usage: true },
});
let text = '', reasoning = '', finish = null, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta?.content ?? '';
    reasoning += c.delta?.reasoning_content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.ok(chunks >= 2, 'stream has chunks');
assert.ok(['stop', 'length'].includes(finish), 'finish_reason ' + finish);
assert.ok(usage && usage.completion_tokens >= 1 && usage.prompt_tokens > 0, 'usage');
console.log(`openai: streamed chat, ${chunks} chunks, finish ${finish}, ${usage.completion_tokens} tokens`);

// 2. tool-call round trip: tools declared, then the assistant's call and the tool's result sent back
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                required: ['city'] } } }];
const first = await client.chat.completions.create({
  model: 'k3', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'auto', max_tokens: 6,
});
assert.equal(first.choices[0].message.role, 'assistant');
const call = first.choices[0].message.tool_calls?.[0] ??
  { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 3}' } };
const second = await client.chat.completions.create({
  model: 'k3', tools, max_tokens: 6,
  messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: '{"forecast": ["sun", "rain"]}' },
  ],
});
assert.ok(['stop', 'length', 'tool_calls'].includes(second.choices[0].finish_reason));
assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens, 'the call and its result are in the prompt');
console.log(`openai: tool round trip, prompt ${first.usage.prompt_tokens} -> ${second.usage.prompt_tokens} tokens`);

// 3. an error: 400 naming the field
try {
  await client.chat.completions.create({ model: 'k3', messages: [{ role: 'wizard', content: 'x' }] });
  assert.fail('an unknown role was accepted');
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError, 'BadRequestError, got ' + e);
  assert.equal(e.status, 400);
  assert.equal(e.param, 'messages[0].role');
  console.log('openai: error 400 ' + e.message);
}
// and 401 with a wrong key
try {
  await new OpenAI({ baseURL: process.env.K3_URL + '/v1', apiKey: 'wrong', maxRetries: 0 }).models.list();
  assert.fail('a wrong key was accepted');
} catch (e) {
  assert.ok(e instanceof OpenAI.AuthenticationError, 'AuthenticationError, got ' + e);
}
// 4. logit_bias and penalties pass through the client: +100 on the first id of "hello" (from k3's
// /tokenize; its text from /detokenize) makes every token that one; an id past the vocabulary is
// a 400 naming it
const k3post = async (path, body) => (await fetch(process.env.K3_URL + path, { method: 'POST',
  headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + process.env.K3_KEY },
  body: JSON.stringify(body) })).json();
const id = (await k3post('/tokenize', { prompt: 'hello' })).tokens[0];
const piece = (await k3post('/detokenize', { tokens: [id] })).prompt;
const biased = await client.chat.completions.create({
  model: 'k3', messages: [{ role: 'user', content: 'Say anything' }], max_tokens: 4, reasoning_effort: 'none',
  logit_bias: { [String(id)]: 100 }, presence_penalty: 1.5, frequency_penalty: 0.5,
});
assert.equal(biased.choices[0].message.content, piece.repeat(4), 'logit_bias: ' + biased.choices[0].message.content);
try {
  await client.chat.completions.create({ model: 'k3', messages: [{ role: 'user', content: 'x' }],
    logit_bias: { '999999999': 5 } });
  assert.fail('a bias past the vocabulary was accepted');
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError, 'BadRequestError, got ' + e);
  assert.equal(e.param, 'logit_bias.999999999');
}
console.log(`openai: logit_bias +100 on id ${id}: "${biased.choices[0].message.content}"`);
const models = await client.models.list();
assert.equal(models.data[0].id, 'k3');
console.log('openai: all passed');
