// The runtime's reuse stores (docs/reuse.md): each tenant's documents and the tool-result cache,
// one per Runtime and shared by everything that serves through it (the C++ and C APIs, the HTTP
// server). Internal: the embedding API reaches them through Runtime::put_document and
// GenerationRequest::documents.
#pragma once
#include <steward/runtime.h>

#include "reuse/document_store.h"
#include "reuse/tool_cache.h"

namespace steward {

reuse::DocumentStore& runtime_documents(Runtime& rt);
reuse::ToolResultCache& runtime_tool_results(Runtime& rt);
// After a document operation on runtime_documents: the KV of documents that stopped being servable
// (a new version, a TTL past, a DELETE) is dropped from every pool and its tiers.
void sweep_documents(Runtime& rt);
// Seconds on the clock the stores are kept with (monotonic): TTLs and ages.
double reuse_clock_s();

}  // namespace steward
