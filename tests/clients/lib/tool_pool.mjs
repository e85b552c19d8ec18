// A config for the client tests of tools: one pool of a small synthetic llama (written on first
// start) whose vocabulary spells JSON, rendered with Hermes 3's real tool-use template. The real
// TinyStories model cannot spell a call ('{' is not in its vocabulary), and the templates' tool
// system blocks would fill its 512-token context. Random weights still give a call under
// tool_choice required / any / a named tool: the output is constrained to the template's format.
import path from 'node:path';
import { tempFile, chatTemplate } from './server.mjs';

export const TOOL_POOL = 'tools';

// Returns the args for startServer: ['--config', FILE].
export function toolPoolArgs() {
  const config = tempFile('tools.toml', '');
  const model = path.join(path.dirname(config), 'tools.gguf');
  const toml = `[[pool]]
name = "${TOOL_POOL}"
model = "${model}"
threads = 1
kv_blocks = 256
block_size = 16
max_batch = 16
max_batch_tokens = 512
chat_template_file = "${chatTemplate('NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja')}"
[pool.synth]
dim = 64
layers = 1
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 4096
seed = 5
[[bucket]]
name = "default"
pool = "${TOOL_POOL}"
`;
  return ['--config', tempFile('tools.toml', toml)];
}
