// Documents as first-class cached objects (docs/reuse.md): a tenant registers a document (text,
// version, TTL, permission labels); a request references it by id (and optionally version) and
// carries its caller's labels. The store answers which documents a request may use, or why not
// (403 a label does not cover it, 404 unknown or expired, 409 an old version). Plain C++, no
// actors; thread-safe (one mutex). Time is passed in (seconds on any monotonic clock) so tests
// drive expiry without sleeping.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace steward::reuse {

// Bounds of the store (the server's defaults; a PUT past them is refused with a message naming the bound).
struct DocumentLimits {
    size_t max_documents_per_tenant = 4096;
    size_t max_bytes_per_tenant = 64u << 20;  // text bytes of one tenant's documents together
    size_t max_document_bytes = 4u << 20;     // one document's text
    size_t max_labels = 64;                   // acl entries of one document, and labels of one caller
    size_t max_id_bytes = 256;
};

struct Document {
    std::string tenant, id, text;
    uint64_t version = 0;
    double ttl_s = 0;             // 0: never expires
    double registered_at = 0;     // the clock's seconds at the PUT
    std::vector<std::string> acl; // sorted, unique; empty: every caller of the tenant
    size_t bytes = 0;             // the text's size (list() leaves the text out)
    bool expired(double now) const { return ttl_s > 0 && now >= registered_at + ttl_s; }
};

// A request's reference: "documents": [{"id", "version"}] or a {"type": "document"} content part.
struct DocumentRef {
    std::string id;
    std::optional<uint64_t> version;  // none: the current one
};

// Why a request may not use a document: the HTTP status, an OpenAI-style code and a message that
// names the document and the fix. status 0: no refusal.
struct DocumentRefusal {
    int status = 0;
    std::string code;     // "document_forbidden" 403, "document_not_found" / "document_expired" 404,
                          // "document_version_conflict" 409
    std::string id;
    std::string message;
};

// What a PUT gave: the version stored and the one it replaced (0: none).
struct PutResult {
    uint64_t version = 0;
    uint64_t replaced = 0;
};

// A document that stopped being servable (a new version, a TTL past, a DELETE): the caller drops
// what it cached for it (its KV blocks are keyed by tenant, id and version).
struct Invalidation {
    std::string tenant, id;
    uint64_t version = 0;
    const char* why = "";  // "replaced", "expired", "deleted"
};

// The documents as a prompt holds them (docs/reuse.md): each as
// <document id="ID" version="V">\nTEXT\n</document>, joined by newlines, in the order given.
std::string documents_block(const std::vector<std::shared_ptr<const Document>>& docs);

// The key of one version of a tenant's document: what its cached KV blocks carry, so that a new
// version, an expiry or a DELETE drops them (KvManager::invalidate_reuse). FNV-1a over the three.
uint64_t document_key(const std::string& tenant, const std::string& id, uint64_t version);

// A label set's canonical form: sorted, unique, joined with '\n' (labels hold no newline).
std::string canonical_labels(std::vector<std::string> labels);
// A label is 1-128 bytes of printable ASCII without spaces or newlines. nullopt: valid; else why.
std::optional<std::string> label_problem(const std::string& label);
// Whether `caller` labels cover a document's acl: an empty acl is covered by every caller of the
// tenant; otherwise any one label in common covers it (acl ["team:legal", "user:42"]: a member of
// team:legal or user 42).
bool labels_cover(const std::vector<std::string>& acl, const std::vector<std::string>& caller);

class DocumentStore {
public:
    explicit DocumentStore(DocumentLimits limits = {}) : limits_(limits) {}

    // Registers (or replaces) tenant's document. version 0: the current one + 1 (1 for a new id);
    // otherwise it must be greater than the current version (else a 409 refusal). The text must be
    // non-empty valid UTF-8 within the bounds; ttl_s >= 0; the id 1-256 bytes of [A-Za-z0-9._:-].
    // A replaced version is reported through take_invalidations().
    struct Put {
        std::string text;
        uint64_t version = 0;
        double ttl_s = 0;
        std::vector<std::string> acl;
    };
    std::optional<PutResult> put(const std::string& tenant, const std::string& id, Put doc, double now,
                                 DocumentRefusal& refusal);
    // The current version, nullopt when unknown or expired (an expired one is dropped here).
    std::shared_ptr<const Document> get(const std::string& tenant, const std::string& id, double now);
    // Removes it; false when there was none.
    bool remove(const std::string& tenant, const std::string& id);
    // The tenant's live documents (no text), sorted by id.
    std::vector<Document> list(const std::string& tenant, double now);

    // The documents a request of `tenant` with `caller` labels references, in canonical order
    // (sorted by id, duplicates once), or the first refusal in the order the request listed them:
    // unknown id (404 document_not_found), expired (404 document_expired), labels that do not cover
    // it (403 document_forbidden: the message names the document, never its text or acl), a
    // version that is not the current one (409 document_version_conflict naming both versions).
    // Counted in stats(): hits (one per document served), refused_permission, expired, conflicts.
    std::optional<std::vector<std::shared_ptr<const Document>>> resolve(const std::string& tenant,
                                                                        const std::vector<std::string>& caller,
                                                                        const std::vector<DocumentRef>& refs, double now,
                                                                        DocumentRefusal& refusal);

    // Drops every expired document (each reported as an Invalidation "expired").
    void expire(double now);
    // What stopped being servable since the last call, in order.
    std::vector<Invalidation> take_invalidations();

    struct Stats {
        uint64_t documents = 0, bytes = 0;  // live, all tenants
        uint64_t hits = 0, refused_permission = 0, expired = 0, not_found = 0, conflicts = 0;
    };
    Stats stats() const;

private:
    struct TenantDocs {
        std::map<std::string, std::shared_ptr<const Document>> by_id;
        size_t bytes = 0;
    };
    void drop_locked(TenantDocs& t, std::map<std::string, std::shared_ptr<const Document>>::iterator it, const char* why);
    DocumentLimits limits_;
    mutable std::mutex mu_;
    std::map<std::string, TenantDocs> tenants_;
    std::vector<Invalidation> invalidations_;
    Stats stats_;
};

}  // namespace steward::reuse
