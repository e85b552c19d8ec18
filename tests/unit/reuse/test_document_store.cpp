// Tests for runtime/reuse/document_store: versions, TTL expiry, invalidations, the refusals of a
// resolve (403 / 404 / 409, their messages), tenant isolation, bounds, invalid input, and random
// put / remove / resolve / time sequences checked against the test's own model of the store.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "reuse/document_store.h"

using namespace steward::reuse;

namespace {

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

DocumentStore::Put doc(std::string text, uint64_t version = 0, double ttl_s = 0, std::vector<std::string> acl = {}) {
    DocumentStore::Put p;
    p.text = std::move(text);
    p.version = version;
    p.ttl_s = ttl_s;
    p.acl = std::move(acl);
    return p;
}

std::vector<DocumentRef> refs(std::initializer_list<DocumentRef> r) {
    return r;
}

}  // namespace

TEST_CASE("documents: labels helpers", "[reuse]") {
    CHECK(canonical_labels({"b", "a", "b", "c"}) == "a\nb\nc");
    CHECK(canonical_labels({}) == "");
    CHECK(canonical_labels({"x"}) == "x");

    CHECK_FALSE(label_problem("team:legal"));
    CHECK_FALSE(label_problem(std::string(128, 'a')));
    CHECK(label_problem(std::string(129, 'a')));
    CHECK(label_problem(""));
    CHECK(label_problem("has space"));
    CHECK(label_problem("new\nline"));
    CHECK(label_problem("tab\t"));
    CHECK(label_problem("\x7f"));
    CHECK(label_problem("caf\xc3\xa9"));
    CHECK_FALSE(label_problem("!~"));

    CHECK(labels_cover({}, {}));
    CHECK(labels_cover({}, {"anything"}));
    CHECK_FALSE(labels_cover({"team:legal"}, {}));
    CHECK_FALSE(labels_cover({"team:legal"}, {"team:sales"}));
    CHECK(labels_cover({"team:legal", "user:42"}, {"user:7", "user:42"}));
    CHECK_FALSE(labels_cover({"team:legal", "user:42"}, {"user:4", "team"}));
}

TEST_CASE("documents: put and get with versions", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    auto p1 = s.put("acme", "policy", doc("v one"), 10, r);
    REQUIRE(p1);
    CHECK(p1->version == 1);
    CHECK(p1->replaced == 0);
    CHECK(r.status == 0);
    CHECK(s.take_invalidations().empty());

    auto p2 = s.put("acme", "policy", doc("v two"), 11, r);
    REQUIRE(p2);
    CHECK(p2->version == 2);
    CHECK(p2->replaced == 1);
    auto inv = s.take_invalidations();
    REQUIRE(inv.size() == 1);
    CHECK(inv[0].tenant == "acme");
    CHECK(inv[0].id == "policy");
    CHECK(inv[0].version == 1);
    CHECK(std::string(inv[0].why) == "replaced");
    CHECK(s.take_invalidations().empty());

    auto p3 = s.put("acme", "policy", doc("v seven", 7), 12, r);
    REQUIRE(p3);
    CHECK(p3->version == 7);
    CHECK(p3->replaced == 2);
    auto p4 = s.put("acme", "policy", doc("v eight"), 13, r);
    REQUIRE(p4);
    CHECK(p4->version == 8);

    auto d = s.get("acme", "policy", 14);
    REQUIRE(d);
    CHECK(d->text == "v eight");
    CHECK(d->version == 8);
    CHECK(d->tenant == "acme");
    CHECK(d->registered_at == 13);
    CHECK_FALSE(s.get("other", "policy", 14));
    CHECK_FALSE(s.get("acme", "nope", 14));

    auto st = s.stats();
    CHECK(st.documents == 1);
    CHECK(st.bytes == std::string("v eight").size());
}

TEST_CASE("documents: explicit version must grow", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("acme", "p", doc("a", 5), 0, r));
    s.take_invalidations();
    for (uint64_t v : {5u, 4u, 1u}) {
        CHECK_FALSE(s.put("acme", "p", doc("b", v), 1, r));
        CHECK(r.status == 409);
        CHECK(r.code == "document_version_conflict");
        CHECK(r.id == "p");
        CHECK(contains(r.message, std::to_string(v)));
        CHECK(contains(r.message, "5"));
    }
    // Nothing changed and nothing was invalidated.
    CHECK(s.take_invalidations().empty());
    CHECK(s.get("acme", "p", 2)->text == "a");
    auto ok = s.put("acme", "p", doc("c", 6), 3, r);
    REQUIRE(ok);
    CHECK(ok->version == 6);
    CHECK(r.status == 0);
}

TEST_CASE("documents: acl stored sorted and unique", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("acme", "p", doc("t", 0, 0, {"user:42", "team:legal", "user:42"}), 0, r));
    auto d = s.get("acme", "p", 0);
    REQUIRE(d);
    CHECK(d->acl == std::vector<std::string>{"team:legal", "user:42"});
}

TEST_CASE("documents: ttl expiry boundary", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("acme", "p", doc("t", 0, 10), 100, r));
    REQUIRE(s.put("acme", "forever", doc("t", 0, 0), 100, r));
    CHECK(s.get("acme", "p", 109.999));
    CHECK(s.list("acme", 109.999).size() == 2);
    CHECK(s.take_invalidations().empty());
    // Exactly registered_at + ttl_s: expired, dropped and reported.
    CHECK_FALSE(s.get("acme", "p", 110));
    auto inv = s.take_invalidations();
    REQUIRE(inv.size() == 1);
    CHECK(inv[0].id == "p");
    CHECK(inv[0].version == 1);
    CHECK(std::string(inv[0].why) == "expired");
    CHECK(s.stats().expired == 1);
    CHECK(s.stats().documents == 1);
    // Dropped once: later accesses neither count nor report again.
    CHECK_FALSE(s.get("acme", "p", 111));
    s.expire(200);
    CHECK(s.stats().expired == 1);
    CHECK(s.take_invalidations().empty());
    CHECK(s.get("acme", "forever", 1e9));
}

TEST_CASE("documents: expire sweeps and list drops", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("a", "x", doc("1", 0, 5), 0, r));
    REQUIRE(s.put("b", "y", doc("22", 0, 8), 0, r));
    REQUIRE(s.put("b", "z", doc("333"), 0, r));
    s.expire(5);
    auto inv = s.take_invalidations();
    REQUIRE(inv.size() == 1);
    CHECK(inv[0].tenant == "a");
    CHECK(inv[0].id == "x");
    CHECK(s.stats().documents == 2);
    CHECK(s.stats().bytes == 5);
    auto l = s.list("b", 8);
    REQUIRE(l.size() == 1);
    CHECK(l[0].id == "z");
    CHECK(l[0].text.empty());
    CHECK(s.stats().expired == 2);
    CHECK(s.take_invalidations().size() == 1);
}

TEST_CASE("documents: list is sorted metadata", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    for (const char* id : {"c", "a", "b"}) REQUIRE(s.put("t", id, doc(std::string("text of ") + id), 0, r));
    REQUIRE(s.put("u", "0", doc("other tenant"), 0, r));
    auto l = s.list("t", 1);
    REQUIRE(l.size() == 3);
    CHECK(l[0].id == "a");
    CHECK(l[1].id == "b");
    CHECK(l[2].id == "c");
    for (const auto& d : l) {
        CHECK(d.text.empty());
        CHECK(d.tenant == "t");
    }
    CHECK(s.list("nobody", 1).empty());
}

TEST_CASE("documents: remove reports deleted", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("t", "p", doc("x"), 0, r));
    CHECK_FALSE(s.remove("other", "p"));
    CHECK(s.remove("t", "p"));
    CHECK_FALSE(s.remove("t", "p"));
    auto inv = s.take_invalidations();
    REQUIRE(inv.size() == 1);
    CHECK(std::string(inv[0].why) == "deleted");
    CHECK(inv[0].version == 1);
    CHECK_FALSE(s.get("t", "p", 0));
    CHECK(s.stats().documents == 0);
    CHECK(s.stats().bytes == 0);
    // A removed id starts over.
    auto again = s.put("t", "p", doc("y"), 1, r);
    REQUIRE(again);
    CHECK(again->version == 1);
    CHECK(again->replaced == 0);
}

TEST_CASE("documents: resolve order dedup and hits", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("t", "zeta", doc("Z"), 0, r));
    REQUIRE(s.put("t", "alpha", doc("A"), 0, r));
    REQUIRE(s.put("t", "mid", doc("M1"), 0, r));
    REQUIRE(s.put("t", "mid", doc("M2"), 0, r));
    auto got = s.resolve("t", {}, refs({{"zeta", std::nullopt}, {"mid", 2}, {"alpha", 1}, {"zeta", 1}}), 1, r);
    REQUIRE(got);
    CHECK(r.status == 0);
    REQUIRE(got->size() == 3);
    CHECK((*got)[0]->id == "alpha");
    CHECK((*got)[1]->id == "mid");
    CHECK((*got)[1]->text == "M2");
    CHECK((*got)[2]->id == "zeta");
    CHECK(s.stats().hits == 3);
    auto none = s.resolve("t", {}, {}, 1, r);
    REQUIRE(none);
    CHECK(none->empty());
    CHECK(s.stats().hits == 3);
}

TEST_CASE("documents: 403 hides text and acl", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    const std::string secret = "Quarterly numbers: revenue 17 percent below plan";
    REQUIRE(s.put("acme", "q3-report", doc(secret, 0, 0, {"team:finance-board", "user:cfo-9"}), 0, r));
    auto got = s.resolve("acme", {"team:legal", "user:1"}, refs({{"q3-report", std::nullopt}}), 1, r);
    CHECK_FALSE(got);
    CHECK(r.status == 403);
    CHECK(r.code == "document_forbidden");
    CHECK(r.id == "q3-report");
    CHECK(contains(r.message, "q3-report"));
    CHECK(contains(r.message, "labels"));
    CHECK_FALSE(contains(r.message, secret));
    CHECK_FALSE(contains(r.message, "revenue"));
    CHECK_FALSE(contains(r.message, "finance-board"));
    CHECK_FALSE(contains(r.message, "cfo-9"));
    CHECK(s.stats().refused_permission == 1);
    CHECK(s.stats().hits == 0);
    // A covering label (any one) serves it.
    auto ok = s.resolve("acme", {"user:cfo-9"}, refs({{"q3-report", std::nullopt}}), 1, r);
    REQUIRE(ok);
    CHECK(ok->size() == 1);
    // The permission check comes before the version: a 403 even for a wrong version.
    CHECK_FALSE(s.resolve("acme", {}, refs({{"q3-report", 9}}), 1, r));
    CHECK(r.status == 403);
    CHECK_FALSE(contains(r.message, "1"));  // not even the current version is told
}

TEST_CASE("documents: 409 names both versions", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("t", "p", doc("x", 41), 0, r));
    REQUIRE(s.put("t", "p", doc("y"), 0, r));  // 42
    CHECK_FALSE(s.resolve("t", {}, refs({{"p", 41}}), 1, r));
    CHECK(r.status == 409);
    CHECK(r.code == "document_version_conflict");
    CHECK(contains(r.message, "41"));
    CHECK(contains(r.message, "42"));
    CHECK(contains(r.message, "version"));
    CHECK(s.stats().conflicts == 1);
    CHECK_FALSE(s.resolve("t", {}, refs({{"p", 43}}), 1, r));
    CHECK(r.status == 409);
    CHECK(s.stats().conflicts == 2);
    CHECK(s.resolve("t", {}, refs({{"p", 42}}), 1, r));
}

TEST_CASE("documents: 404 not found and expired", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("t", "short", doc("x", 0, 5), 0, r));
    REQUIRE(s.put("t", "long", doc("y"), 0, r));
    CHECK_FALSE(s.resolve("t", {}, refs({{"long", std::nullopt}, {"missing", std::nullopt}}), 1, r));
    CHECK(r.status == 404);
    CHECK(r.code == "document_not_found");
    CHECK(r.id == "missing");
    CHECK(s.stats().not_found == 1);
    CHECK(s.stats().hits == 0);

    CHECK(s.resolve("t", {}, refs({{"short", std::nullopt}}), 4.5, r));
    CHECK_FALSE(s.resolve("t", {}, refs({{"long", 1}, {"short", 1}}), 5, r));
    CHECK(r.status == 404);
    CHECK(r.code == "document_expired");
    CHECK(r.id == "short");
    CHECK(s.stats().expired == 1);
    auto inv = s.take_invalidations();
    REQUIRE(inv.size() == 1);
    CHECK(std::string(inv[0].why) == "expired");
    // Dropped: now simply unknown.
    CHECK_FALSE(s.resolve("t", {}, refs({{"short", std::nullopt}}), 6, r));
    CHECK(r.code == "document_not_found");
    CHECK(s.stats().expired == 1);
}

TEST_CASE("documents: first refusal in request order wins", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("t", "locked", doc("x", 0, 0, {"team:a"}), 0, r));
    REQUIRE(s.put("t", "open", doc("y"), 0, r));
    CHECK_FALSE(s.resolve("t", {}, refs({{"open", 7}, {"locked", std::nullopt}, {"nope", std::nullopt}}), 1, r));
    CHECK(r.status == 409);
    CHECK(r.id == "open");
    CHECK_FALSE(s.resolve("t", {}, refs({{"nope", std::nullopt}, {"open", 7}, {"locked", std::nullopt}}), 1, r));
    CHECK(r.status == 404);
    CHECK_FALSE(s.resolve("t", {}, refs({{"locked", std::nullopt}, {"nope", std::nullopt}}), 1, r));
    CHECK(r.status == 403);
    CHECK(s.stats().conflicts == 1);
    CHECK(s.stats().not_found == 1);
    CHECK(s.stats().refused_permission == 1);
}

TEST_CASE("documents: tenants are isolated", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    REQUIRE(s.put("alice", "shared-id", doc("alice's text"), 0, r));
    CHECK_FALSE(s.resolve("bob", {}, refs({{"shared-id", std::nullopt}}), 1, r));
    CHECK(r.status == 404);
    CHECK(r.code == "document_not_found");
    CHECK_FALSE(contains(r.message, "alice"));
    CHECK_FALSE(s.get("bob", "shared-id", 1));
    CHECK_FALSE(s.remove("bob", "shared-id"));
    // Bob's own document of the same id is independent (its own version 1).
    auto pb = s.put("bob", "shared-id", doc("bob's text"), 1, r);
    REQUIRE(pb);
    CHECK(pb->version == 1);
    CHECK(pb->replaced == 0);
    auto a = s.resolve("alice", {}, refs({{"shared-id", 1}}), 2, r);
    auto b = s.resolve("bob", {}, refs({{"shared-id", 1}}), 2, r);
    REQUIRE(a);
    REQUIRE(b);
    CHECK((*a)[0]->text == "alice's text");
    CHECK((*b)[0]->text == "bob's text");
}

TEST_CASE("documents: invalid input refused", "[reuse]") {
    DocumentStore s;
    DocumentRefusal r;
    auto refused = [&](const std::string& id, DocumentStore::Put p, const std::string& field) {
        r = {};
        bool failed = !s.put("t", id, std::move(p), 0, r);
        CHECK(failed);
        CHECK(r.status == 400);
        CHECK(r.code == "invalid_document");
        CHECK(contains(r.message, field));
    };
    refused("", doc("x"), "id");
    refused(std::string(257, 'a'), doc("x"), "id");
    refused("has space", doc("x"), "id");
    refused("slash/no", doc("x"), "id");
    refused("ok", doc(""), "text");
    refused("ok", doc("bad \xff byte"), "UTF-8");
    refused("ok", doc("overlong \xc0\xaf"), "UTF-8");
    refused("ok", doc("surrogate \xed\xa0\x80"), "UTF-8");
    refused("ok", doc("cut \xe2\x82"), "UTF-8");
    refused("ok", doc("x", 0, -1), "ttl_s");
    refused("ok", doc("x", 0, std::numeric_limits<double>::infinity()), "ttl_s");
    refused("ok", doc("x", 0, std::nan("")), "ttl_s");
    refused("ok", doc("x", 0, 0, {"good", "bad label"}), "acl");
    refused("ok", doc("x", 0, 0, {""}), "acl");
    std::vector<std::string> many;
    for (int i = 0; i < 65; i++) many.push_back("l" + std::to_string(i));
    refused("ok", doc("x", 0, 0, many), "max_labels");
    CHECK(s.stats().documents == 0);

    // What is allowed at the edges.
    many.pop_back();
    CHECK(s.put("t", std::string(256, 'a'), doc("x", 0, 0, many), 0, r));
    CHECK(s.put("t", "A-z_0.9:x", doc("caf\xc3\xa9 \xf0\x9f\x98\x80"), 0, r));
}

TEST_CASE("documents: tenant bounds", "[reuse]") {
    DocumentLimits lim;
    lim.max_documents_per_tenant = 2;
    lim.max_bytes_per_tenant = 10;
    lim.max_document_bytes = 6;
    DocumentStore s(lim);
    DocumentRefusal r;
    CHECK_FALSE(s.put("t", "big", doc("1234567"), 0, r));
    CHECK(r.status == 400);
    CHECK(r.code == "document_limit");
    CHECK(contains(r.message, "max_document_bytes"));

    REQUIRE(s.put("t", "a", doc("123456"), 0, r));
    CHECK_FALSE(s.put("t", "b", doc("12345"), 0, r));
    CHECK(r.code == "document_limit");
    CHECK(contains(r.message, "max_bytes_per_tenant"));
    REQUIRE(s.put("t", "b", doc("1234"), 0, r));
    CHECK_FALSE(s.put("t", "c", doc("1"), 0, r));
    CHECK(r.code == "document_limit");
    CHECK(contains(r.message, "max_documents_per_tenant"));
    // Another tenant has its own bounds, and a replacement counts in place of the old text.
    CHECK(s.put("u", "c", doc("1"), 0, r));
    CHECK(s.put("t", "a", doc("12"), 0, r));
    CHECK(s.put("t", "b", doc("123456"), 0, r));
    CHECK(s.stats().bytes == 9);
    CHECK_FALSE(s.put("t", "a", doc("12345"), 0, r));
    CHECK(contains(r.message, "max_bytes_per_tenant"));
    CHECK(s.get("t", "a", 0)->text == "12");
    // Expired documents do not count against the bounds.
    REQUIRE(s.remove("t", "b"));
    REQUIRE(s.put("t", "b", doc("1", 0, 5), 0, r));
    CHECK_FALSE(s.put("t", "c", doc("1"), 1, r));
    CHECK(s.put("t", "c", doc("1"), 5, r));
}

// Random put / remove / resolve / expire sequences against a model of the store written from the
// contract: a resolve never serves another tenant's document, an uncovered one, an expired one or
// an old version, and its refusal is the first one in request order.
TEST_CASE("documents: property vs model", "[reuse][property]") {
    const std::vector<std::string> tenants = {"t0", "t1", "t2"};
    const std::vector<std::string> ids = {"a", "b", "c", "d"};
    const std::vector<std::string> labels = {"x", "y", "z"};
    struct Rec {
        uint64_t version;
        std::string text;
        std::set<std::string> acl;
        double registered_at, ttl_s;
        bool expired(double now) const { return ttl_s > 0 && now >= registered_at + ttl_s; }
    };
    for (uint32_t seed = 1; seed <= 20; seed++) {
        CAPTURE(seed);
        std::mt19937 rng(seed);
        auto pick = [&](size_t n) { return (size_t)std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
        auto subset = [&] {
            std::vector<std::string> out;
            for (const auto& l : labels)
                if (pick(3) == 0) out.push_back(l);
            return out;
        };
        DocumentStore s;
        std::map<std::pair<std::string, std::string>, Rec> model;  // (tenant, id)
        double now = 0;
        uint64_t served = 0, texts = 0;
        for (int op = 0; op < 2000; op++) {
            CAPTURE(op);
            const std::string tenant = tenants[pick(3)];
            const size_t kind = pick(10);
            DocumentRefusal r;
            if (kind < 4) {  // put
                const std::string id = ids[pick(4)];
                auto m = model.find({tenant, id});
                const bool live = m != model.end() && !m->second.expired(now);
                const uint64_t cur = live ? m->second.version : 0;
                uint64_t v = 0;
                if (pick(3) == 0) v = live && pick(2) ? cur - pick(2) : cur + 1 + pick(3);
                const double ttl = std::vector<double>{0, 4, 8}[pick(3)];
                auto acl = subset();
                const std::string text = tenant + "/" + id + "#" + std::to_string(++texts);
                auto got = s.put(tenant, id, doc(text, v, ttl, acl), now, r);
                // A replaced live version is reported; anything else reported had expired.
                bool replaced_reported = false;
                for (const auto& inv : s.take_invalidations()) {
                    if (std::string(inv.why) == "replaced") {
                        replaced_reported = true;
                        CHECK(inv.tenant == tenant);
                        CHECK(inv.id == id);
                        CHECK(inv.version == cur);
                    } else {
                        CHECK(std::string(inv.why) == "expired");
                        auto e = model.find({inv.tenant, inv.id});
                        REQUIRE(e != model.end());
                        CHECK(e->second.version == inv.version);
                        CHECK(e->second.expired(now));
                    }
                }
                if (v != 0 && v <= cur) {
                    CHECK_FALSE(got);
                    CHECK(r.status == 409);
                } else {
                    REQUIRE(got);
                    const uint64_t want = v ? v : cur + 1;
                    CHECK(got->version == want);
                    CHECK(got->replaced == cur);
                    model[{tenant, id}] = Rec{want, text, std::set<std::string>(acl.begin(), acl.end()), now, ttl};
                }
                CHECK(replaced_reported == (got && live));
            } else if (kind < 5) {  // remove
                const std::string id = ids[pick(4)];
                auto m = model.find({tenant, id});
                const bool removed = s.remove(tenant, id);
                if (m == model.end())
                    CHECK_FALSE(removed);
                else if (!m->second.expired(now))
                    CHECK(removed);
                if (m != model.end()) model.erase(m);
                s.take_invalidations();
            } else if (kind < 9) {  // resolve
                std::vector<DocumentRef> rs;
                const size_t n = 1 + pick(3);
                for (size_t i = 0; i < n; i++) {
                    DocumentRef ref{ids[pick(4)], std::nullopt};
                    auto m = model.find({tenant, ref.id});
                    if (pick(3) == 0) ref.version = m != model.end() ? m->second.version - pick(2) : 1;
                    rs.push_back(ref);
                }
                const auto caller = subset();
                // The model's answer: the first refusal in order, else the referenced set.
                int want_status = 0;
                std::string want_id, want_code;
                std::set<std::string> want_ids;
                for (const auto& ref : rs) {
                    auto m = model.find({tenant, ref.id});
                    bool covered = false;
                    if (m != model.end()) {
                        covered = m->second.acl.empty();
                        for (const auto& l : caller) covered = covered || m->second.acl.count(l);
                    }
                    if (m == model.end() || m->second.expired(now))
                        want_status = 404;
                    else if (!covered)
                        want_status = 403;
                    else if (ref.version && *ref.version != m->second.version)
                        want_status = 409;
                    else {
                        want_ids.insert(ref.id);
                        continue;
                    }
                    want_id = ref.id;
                    if (m == model.end()) want_code = "document_not_found";      // expired: either 404 code
                    if (want_status == 404 && m != model.end()) model.erase(m);  // dropped (or to be)
                    break;
                }
                auto got = s.resolve(tenant, caller, rs, now, r);
                if (want_status) {
                    CHECK_FALSE(got);
                    CHECK(r.status == want_status);
                    CHECK(r.id == want_id);
                    if (!want_code.empty()) CHECK(r.code == want_code);
                } else {
                    REQUIRE(got);
                    CHECK(r.status == 0);
                    std::vector<std::string> got_ids;
                    for (const auto& d : *got) {
                        got_ids.push_back(d->id);
                        // Never another tenant's, an uncovered, an expired or an old version.
                        CHECK(d->tenant == tenant);
                        CHECK(labels_cover(d->acl, caller));
                        CHECK_FALSE(d->expired(now));
                        const Rec& m = model.at({tenant, d->id});
                        CHECK(d->version == m.version);
                        CHECK(d->text == m.text);
                        CHECK(d->text.compare(0, tenant.size() + 1, tenant + "/") == 0);
                    }
                    CHECK(got_ids == std::vector<std::string>(want_ids.begin(), want_ids.end()));
                    served += got->size();
                }
                s.take_invalidations();
            } else {  // time passes; sometimes a sweep
                now += std::vector<double>{0.5, 1, 3, 4, 8}[pick(5)];
                if (pick(2)) {
                    s.expire(now);
                    for (const auto& inv : s.take_invalidations()) {
                        CHECK(std::string(inv.why) == "expired");
                        auto e = model.find({inv.tenant, inv.id});
                        REQUIRE(e != model.end());
                        CHECK(e->second.version == inv.version);
                        CHECK(e->second.expired(now));
                    }
                    for (auto it = model.begin(); it != model.end();)
                        it = it->second.expired(now) ? model.erase(it) : std::next(it);
                }
            }
        }
        CHECK(s.stats().hits == served);
        // The live set matches the model's.
        for (const auto& t : tenants) {
            std::vector<std::string> want, got;
            for (const auto& [k, rec] : model)
                if (k.first == t && !rec.expired(now)) want.push_back(k.second);
            for (const auto& d : s.list(t, now)) got.push_back(d.id);
            CHECK(got == want);
        }
    }
}
