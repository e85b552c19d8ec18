// Documents as cached objects: the tenant-keyed store behind /v1/documents and a chat's
// "documents" references (docs/reuse.md). See document_store.h for the contract.
#include "reuse/document_store.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "util/utf8.h"

namespace steward::reuse {

namespace {

constexpr size_t k_max_label_bytes = 128;

bool id_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == ':' || c == '-';
}

// A refusal of a PUT (status, code, message naming the field or bound and the fix).
void refuse(DocumentRefusal& r, int status, const char* code, const std::string& id, std::string message) {
    r.status = status;
    r.code = code;
    r.id = id;
    r.message = std::move(message);
}

std::string bytes_str(size_t bytes) {
    return std::to_string(bytes) + " bytes";
}

}  // namespace

std::string documents_block(const std::vector<std::shared_ptr<const Document>>& docs) {
    std::string s;
    for (const auto& d : docs) {
        if (!s.empty()) s += "\n";
        s += "<document id=\"" + d->id + "\" version=\"" + std::to_string(d->version) + "\">\n" + d->text + "\n</document>";
    }
    return s;
}

uint64_t document_key(const std::string& tenant, const std::string& id, uint64_t version) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](const void* p, size_t n) {
        for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
    };
    const unsigned char sep = 0;
    mix(tenant.data(), tenant.size());
    mix(&sep, 1);
    mix(id.data(), id.size());
    mix(&sep, 1);
    for (int i = 0; i < 8; i++) {
        const unsigned char b = (unsigned char)(version >> (8 * i));
        mix(&b, 1);
    }
    return h;
}

std::string canonical_labels(std::vector<std::string> labels) {
    std::sort(labels.begin(), labels.end());
    labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
    std::string out;
    for (size_t i = 0; i < labels.size(); i++) {
        if (i) out += '\n';
        out += labels[i];
    }
    return out;
}

std::optional<std::string> label_problem(const std::string& label) {
    // The label itself is not echoed: it may hold bytes unfit for a message.
    if (label.empty())
        return std::string("a label must not be empty (1-128 bytes of printable ASCII, e.g. \"team:legal\")");
    if (label.size() > k_max_label_bytes)
        return "a label must be at most 128 bytes (this one has " + std::to_string(label.size()) + ")";
    for (size_t i = 0; i < label.size(); i++) {
        const auto c = (unsigned char)label[i];
        if (c < 0x21 || c > 0x7e)
            return "a label must be printable ASCII without spaces or control characters (byte " + std::to_string(i) +
                   " is " + std::to_string(c) + ")";
    }
    return std::nullopt;
}

bool labels_cover(const std::vector<std::string>& acl, const std::vector<std::string>& caller) {
    if (acl.empty()) return true;
    for (const auto& l : caller)
        if (std::find(acl.begin(), acl.end(), l) != acl.end()) return true;
    return false;
}

void DocumentStore::drop_locked(TenantDocs& t, std::map<std::string, std::shared_ptr<const Document>>::iterator it,
                                const char* why) {
    const Document& d = *it->second;
    invalidations_.push_back({d.tenant, d.id, d.version, why});
    if (std::string_view(why) == "expired") stats_.expired++;
    t.bytes -= d.text.size();
    t.by_id.erase(it);
}

std::optional<PutResult> DocumentStore::put(const std::string& tenant, const std::string& id, Put doc, double now,
                                            DocumentRefusal& refusal) {
    refusal = {};
    // The request's own fields first: each refusal names the field and what it must be.
    if (id.empty() || id.size() > limits_.max_id_bytes || !std::all_of(id.begin(), id.end(), id_char)) {
        refuse(refusal, 400, "invalid_document", id,
               "the document id must be 1-" + std::to_string(limits_.max_id_bytes) +
                   " characters of [A-Za-z0-9._:-] (e.g. \"policy-2024.v1\")");
        return std::nullopt;
    }
    if (doc.text.empty()) {
        refuse(refusal, 400, "invalid_document", id, "'text' must not be empty: send the document's text");
        return std::nullopt;
    }
    if (doc.text.size() > limits_.max_document_bytes) {
        refuse(refusal, 400, "document_limit", id,
               "'text' of document '" + id + "' has " + bytes_str(doc.text.size()) + ", past max_document_bytes (" +
                   bytes_str(limits_.max_document_bytes) + "): split it into smaller documents");
        return std::nullopt;
    }
    if (size_t bad = utf8::invalid_at(doc.text); bad != std::string_view::npos) {
        refuse(refusal, 400, "invalid_document", id,
               "'text' must be valid UTF-8 (byte " + std::to_string(bad) + " is not): re-encode the document as UTF-8");
        return std::nullopt;
    }
    if (!std::isfinite(doc.ttl_s) || doc.ttl_s < 0) {
        refuse(refusal, 400, "invalid_document", id,
               "'ttl_s' must be a finite number of seconds >= 0 (0: never expires)");
        return std::nullopt;
    }
    if (doc.acl.size() > limits_.max_labels) {
        refuse(refusal, 400, "invalid_document", id,
               "'acl' holds " + std::to_string(doc.acl.size()) + " labels, more than max_labels (" +
                   std::to_string(limits_.max_labels) + "): use fewer, broader labels");
        return std::nullopt;
    }
    for (const auto& l : doc.acl)
        if (auto why = label_problem(l)) {
            refuse(refusal, 400, "invalid_document", id, "'acl': " + *why);
            return std::nullopt;
        }
    std::sort(doc.acl.begin(), doc.acl.end());
    doc.acl.erase(std::unique(doc.acl.begin(), doc.acl.end()), doc.acl.end());

    std::lock_guard<std::mutex> lock(mu_);
    TenantDocs& t = tenants_[tenant];
    // Expired documents of the tenant neither hold a version nor count against its bounds.
    for (auto it = t.by_id.begin(); it != t.by_id.end();) {
        auto next = std::next(it);
        if (it->second->expired(now)) drop_locked(t, it, "expired");
        it = next;
    }
    auto cur = t.by_id.find(id);
    const uint64_t current = cur == t.by_id.end() ? 0 : cur->second->version;
    uint64_t version = doc.version;
    if (version == 0) {
        if (current == UINT64_MAX) {
            refuse(refusal, 409, "document_version_conflict", id,
                   "document '" + id + "' is at the largest version: DELETE it and register it again");
            return std::nullopt;
        }
        version = current + 1;
    } else if (version <= current) {
        refuse(refusal, 409, "document_version_conflict", id,
               "document '" + id + "': version " + std::to_string(version) +
                   " is not greater than the current version " + std::to_string(current) +
                   ": send a version greater than " + std::to_string(current) + ", or omit 'version' to get " +
                   std::to_string(current + 1));
        return std::nullopt;
    }
    // The tenant's bounds, counting the replacement in place of the document it replaces.
    const size_t old_bytes = cur == t.by_id.end() ? 0 : cur->second->text.size();
    if (cur == t.by_id.end() && t.by_id.size() >= limits_.max_documents_per_tenant) {
        refuse(refusal, 400, "document_limit", id,
               "the tenant holds " + std::to_string(t.by_id.size()) +
                   " documents, the max_documents_per_tenant bound: "
                   "DELETE documents it no longer uses first");
        return std::nullopt;
    }
    if (t.bytes - old_bytes + doc.text.size() > limits_.max_bytes_per_tenant) {
        refuse(refusal, 400, "document_limit", id,
               "document '" + id + "' would bring the tenant's text to " +
                   bytes_str(t.bytes - old_bytes + doc.text.size()) + ", past max_bytes_per_tenant (" +
                   bytes_str(limits_.max_bytes_per_tenant) + "): DELETE documents it no longer uses first");
        return std::nullopt;
    }

    auto d = std::make_shared<Document>();
    d->tenant = tenant;
    d->id = id;
    d->text = std::move(doc.text);
    d->version = version;
    d->ttl_s = doc.ttl_s;
    d->registered_at = now;
    d->acl = std::move(doc.acl);
    if (cur != t.by_id.end()) {
        invalidations_.push_back({tenant, id, current, "replaced"});
        t.bytes -= old_bytes;
    }
    t.bytes += d->text.size();
    t.by_id[id] = std::move(d);
    return PutResult{version, current};
}

std::shared_ptr<const Document> DocumentStore::get(const std::string& tenant, const std::string& id, double now) {
    std::lock_guard<std::mutex> lock(mu_);
    auto t = tenants_.find(tenant);
    if (t == tenants_.end()) return nullptr;
    auto it = t->second.by_id.find(id);
    if (it == t->second.by_id.end()) return nullptr;
    if (it->second->expired(now)) {
        drop_locked(t->second, it, "expired");
        return nullptr;
    }
    return it->second;
}

bool DocumentStore::remove(const std::string& tenant, const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto t = tenants_.find(tenant);
    if (t == tenants_.end()) return false;
    auto it = t->second.by_id.find(id);
    if (it == t->second.by_id.end()) return false;
    drop_locked(t->second, it, "deleted");
    return true;
}

std::vector<Document> DocumentStore::list(const std::string& tenant, double now) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Document> out;
    auto t = tenants_.find(tenant);
    if (t == tenants_.end()) return out;
    for (auto it = t->second.by_id.begin(); it != t->second.by_id.end();) {
        auto next = std::next(it);
        if (it->second->expired(now)) {
            drop_locked(t->second, it, "expired");
        } else {
            Document d = *it->second;
            d.bytes = d.text.size();
            d.text.clear();  // metadata only
            out.push_back(std::move(d));
        }
        it = next;
    }
    return out;  // by_id is a std::map: already sorted by id
}

std::optional<std::vector<std::shared_ptr<const Document>>> DocumentStore::resolve(
    const std::string& tenant, const std::vector<std::string>& caller, const std::vector<DocumentRef>& refs, double now,
    DocumentRefusal& refusal) {
    refusal = {};
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, std::shared_ptr<const Document>> found;  // by id: canonical order, each once
    // A tenant's own documents only: another tenant's is "not found" alike, its existence not told.
    TenantDocs none;
    auto t = tenants_.find(tenant);
    TenantDocs& docs = t == tenants_.end() ? none : t->second;
    for (const auto& ref : refs) {
        auto it = docs.by_id.find(ref.id);
        if (it == docs.by_id.end()) {
            stats_.not_found++;
            refuse(refusal, 404, "document_not_found", ref.id,
                   "no document '" + ref.id + "' for this tenant: register it with PUT /v1/documents/" + ref.id +
                       " or check the id");
            return std::nullopt;
        }
        if (it->second->expired(now)) {
            drop_locked(docs, it, "expired");
            refuse(refusal, 404, "document_expired", ref.id,
                   "document '" + ref.id +
                       "' expired (its ttl_s passed) and was dropped: register it again with PUT "
                       "/v1/documents/" +
                       ref.id);
            return std::nullopt;
        }
        const Document& d = *it->second;
        // Checked before the version, so that a caller who may not read it learns nothing of it.
        if (!labels_cover(d.acl, caller)) {
            stats_.refused_permission++;
            refuse(refusal, 403, "document_forbidden", ref.id,
                   "the caller's labels do not cover the acl of document '" + ref.id +
                       "': the tenant's API key must carry one of its acl labels, or the request must claim one in its "
                       "\"labels\" field");
            return std::nullopt;
        }
        if (ref.version && *ref.version != d.version) {
            stats_.conflicts++;
            refuse(refusal, 409, "document_version_conflict", ref.id,
                   "document '" + ref.id + "': version " + std::to_string(*ref.version) +
                       " was requested but the current version is " + std::to_string(d.version) +
                       ": reference version " + std::to_string(d.version) +
                       " or omit 'version' to use the current one");
            return std::nullopt;
        }
        found.emplace(ref.id, it->second);
    }
    std::vector<std::shared_ptr<const Document>> out;
    out.reserve(found.size());
    for (auto& [id, d] : found) out.push_back(std::move(d));
    stats_.hits += out.size();
    return out;
}

void DocumentStore::expire(double now) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [tenant, t] : tenants_)
        for (auto it = t.by_id.begin(); it != t.by_id.end();) {
            auto next = std::next(it);
            if (it->second->expired(now)) drop_locked(t, it, "expired");
            it = next;
        }
}

std::vector<Invalidation> DocumentStore::take_invalidations() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Invalidation> out;
    out.swap(invalidations_);
    return out;
}

DocumentStore::Stats DocumentStore::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s = stats_;
    s.documents = s.bytes = 0;
    for (const auto& [tenant, t] : tenants_) {
        s.documents += t.by_id.size();
        s.bytes += t.bytes;
    }
    return s;
}

}  // namespace steward::reuse
