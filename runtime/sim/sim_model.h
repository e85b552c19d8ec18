// A simulated pool's model: a GGUF header of the shape (metadata, a synthetic tokenizer of its
// vocabulary, tensor infos of its dtype; no weights), built in memory and loaded as a Model whose
// has_weights() is false.
#pragma once
#include <memory>

#include <steward/config.h>
#include <steward/expected.h>

#include "model/model.h"

namespace steward {

Expected<std::unique_ptr<Model>> sim_model(const SimModelConfig& shape);

}  // namespace steward
