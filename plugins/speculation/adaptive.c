/* speculation/adaptive: per sequence and step, the draft length k with the best predicted goodput,
 * 0 where speculation would not pay, with hysteresis so that the choice does not flap.
 *
 * The model (all inputs through steward_spec_seq; what the host has not measured yet comes from the
 * parameters below):
 *   E(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j        expected tokens of one verification with k drafts,
 *                                                  a_j the conditional acceptance of draft position j
 *   T(k) = T0 + k * (c_verify + c_draft)           the step's time: T0 the step without drafts
 *          + C * E(k) / L  (k > 0)                 (plain_step_ms), c_verify what one more verified
 *                                                  token adds (verify_ms_per_token), c_draft one draft
 *                                                  token's drafting (draft_ms_per_token), C a draft
 *                                                  model's catch-up before drafting (draft_catch_up_ms:
 *                                                  the prompt at a first draft, the output since the
 *                                                  last draft at a probe) amortized over the L tokens
 *                                                  left (all of C when L <= E(k) or unknown)
 *   G(k) = (B - 1 + E(k)) / T(k)                   tokens per ms of the whole batch of B sequences
 *                                                  when only this one drafts k: a longer step costs
 *                                                  the other B - 1 sequences too, so the larger the
 *                                                  batch, the more acceptance speculation needs
 * k* = argmax G over [0, min(k_max, max_budget, tokens left - 1)] (ties to the smaller k); k* > 0 is
 * kept only when it adds at least (min_gain - 1) of this sequence's own plain rate to the batch:
 * G(k*) - G(0) >= (min_gain - 1) * G(0) / B. (One sequence's drafts can add at most E(k) / T(k) to
 * a batch of B; a threshold on the whole batch's goodput, G(k*) >= min_gain * G(0), turned
 * speculation off for every sequence once B passed ~40, whatever the acceptance: the simulated
 * backend showed it at production batch sizes.) Acceptance a_j: the sequence's per-position array
 * (accept_pos), else the bucket's (bucket_accept_pos) where the sequence's has no observation (a
 * negative entry), else recent_acceptance, else prior_acceptance.
 *
 * Hysteresis: a sequence keeps its current k until another k has predicted a goodput above the
 * current one's by margin times the sequence's own plain rate (G(0) / B) for `patience`
 * consecutive steps; its first step takes k* at
 * once, and a k > 0 predicted below plain decoding (G(k) < G(0)) drops to 0 at once. At k = 0 nothing
 * is observed any more, so after probe_every steps one step drafts probe_k tokens (not a switch: only
 * the estimate is refreshed; while the draft's cost is unmeasured the first probe comes at the next
 * step); each probe that leaves the sequence at k = 0 multiplies the wait before
 * the next by probe_backoff (up to probe_every_max steps), and a switch to k > 0 resets it: a draft
 * that keeps failing costs a few probes per sequence, not one every probe_every steps. The trade-off:
 * a real change of acceptance is followed `patience` steps late, in exchange for never paying both
 * sides of a noisy threshold.
 *
 * Hopeless: once the host has measured the times, if even a draft accepted at every position would
 * not pay (max_k G(k) with every a_j = 1 is below the min_gain threshold; e.g. a draft model as slow
 * per token as the target's whole step, or a catch-up too long for the tokens left to pay back),
 * acceptance cannot change the answer: k = 0 and no probes until the measured times change.
 *
 * Params (all optional):
 *   k_max               integer in [0, 16], default 8: the longest chain tried
 *   min_gain            number in [1, 10], default 1.05: the sequence's predicted gain over plain
 *                       decoding needed (as a multiple of its own plain rate)
 *   margin              number in [0, 10], default 0.05: the hysteresis band (a share of the
 *                       sequence's own plain rate)
 *   patience            integer in [1, 1000], default 4: steps a better k must win before switching
 *   probe_every         integer in [0, 100000], default 32: steps at k = 0 between probes (0: never)
 *   probe_k             integer in [1, 16], default 2: draft tokens of a probe
 *   probe_backoff       number in [1, 16], default 2: the wait's growth after a probe that failed
 *                       (1: a probe every probe_every steps)
 *   probe_every_max     integer in [1, 1000000], default 1024: the longest wait between probes
 *   prior_acceptance    number in [0, 1], default 0.5: acceptance before anything was measured
 *   verify_token_share  number in [0, 10], default 0.1: c_verify / T0 until the host measured it
 *   draft_token_share   number in [0, 10], default 0.3: c_draft over a one-token target step (T0 less
 *                       c_verify per other sequence) for a draft model until measured (n-gram: 0)
 * Per-sequence state lives in a direct-mapped table of the instance (no allocation per call); two
 * sequences sharing a slot only restart each other's hysteresis. */
#include "plugin_util.h"

#define ADAPTIVE_K_LIMIT 16
#define ADAPTIVE_SLOTS 1024

typedef struct adaptive_slot {
    uint64_t request_id; /* 0: empty */
    int32_t k;           /* the current choice */
    int32_t n_better;    /* consecutive steps another k beat it by the margin */
    int32_t n_at_zero;   /* steps at k = 0 since the last probe */
    int32_t probe_gap;   /* steps at k = 0 before the next probe (0: probe_every) */
} adaptive_slot;

struct steward_policy {
    int32_t k_max, patience, probe_every, probe_k, probe_every_max;
    double min_gain, margin, prior, verify_share, draft_share, probe_backoff;
    adaptive_slot slots[ADAPTIVE_SLOTS];
};

static int adaptive_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                           char* err, size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    int64_t k_max = 8, patience = 4, probe_every = 32, probe_k = 2, probe_every_max = 1024;
    double min_gain = 1.05, margin = 0.05, prior = 0.5, verify_share = 0.1, draft_share = 0.3, probe_backoff = 2;
    if ((rc = sp_param_int(host, params, "k_max", 8, 0, ADAPTIVE_K_LIMIT, &k_max, err, err_len)) ||
        (rc = sp_param_int(host, params, "patience", 4, 1, 1000, &patience, err, err_len)) ||
        (rc = sp_param_int(host, params, "probe_every", 32, 0, 100000, &probe_every, err, err_len)) ||
        (rc = sp_param_int(host, params, "probe_k", 2, 1, ADAPTIVE_K_LIMIT, &probe_k, err, err_len)) ||
        (rc = sp_param_int(host, params, "probe_every_max", 1024, 1, 1000000, &probe_every_max, err, err_len)) ||
        (rc = sp_param_double(host, params, "probe_backoff", 2, 1, 0, 16, 0, &probe_backoff, err, err_len)) ||
        (rc = sp_param_double(host, params, "min_gain", 1.05, 1, 0, 10, 0, &min_gain, err, err_len)) ||
        (rc = sp_param_double(host, params, "margin", 0.05, 0, 0, 10, 0, &margin, err, err_len)) ||
        (rc = sp_param_double(host, params, "prior_acceptance", 0.5, 0, 0, 1, 0, &prior, err, err_len)) ||
        (rc = sp_param_double(host, params, "verify_token_share", 0.1, 0, 0, 10, 0, &verify_share, err, err_len)) ||
        (rc = sp_param_double(host, params, "draft_token_share", 0.3, 0, 0, 10, 0, &draft_share, err, err_len)))
        return rc;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    self->k_max = (int32_t)k_max;
    self->patience = (int32_t)patience;
    self->probe_every = (int32_t)probe_every;
    self->probe_k = (int32_t)probe_k;
    self->probe_every_max = (int32_t)probe_every_max;
    self->probe_backoff = probe_backoff;
    self->min_gain = min_gain;
    self->margin = margin;
    self->prior = prior;
    self->verify_share = verify_share;
    self->draft_share = draft_share;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static void adaptive_destroy(steward_policy* self) { free(self); }

/* A host value of a field that may lie past the host's struct (then: def). */
#define SEQ_FIELD(seq, field, def) (STEWARD_HAS_FIELD(seq, steward_spec_seq, field) ? (seq)->field : (def))

static double clamp01(double x) { return x < 0 ? 0 : x > 1 ? 1 : x; }

/* The conditional acceptance of draft position i (0-based) for this sequence. */
static double acceptance_at(const steward_policy* self, const steward_spec_seq* seq, int32_t i) {
    const double* a = SEQ_FIELD(seq, accept_pos, (const double*)NULL);
    const uint32_t n = a ? SEQ_FIELD(seq, n_accept_pos, 0u) : 0u;
    if (a && (uint32_t)i < n && a[i] >= 0) return clamp01(a[i]);
    const double* b = SEQ_FIELD(seq, bucket_accept_pos, (const double*)NULL);
    const uint32_t nb = b ? SEQ_FIELD(seq, n_bucket_accept_pos, 0u) : 0u;
    if (b && (uint32_t)i < nb && b[i] >= 0) return clamp01(b[i]);
    if (seq->recent_acceptance >= 0) return clamp01(seq->recent_acceptance);
    return self->prior;
}

/* The share of a catch-up of cu ms that a step yielding e of the left tokens bears (all of it when
 * the tokens left are unknown or fewer than e). */
static double catch_up_share(double cu, double e, double left) {
    if (cu <= 0) return 0.0;
    return left > e ? cu * e / left : cu;
}

/* Fills g[0..k_top] with the predicted goodput G(k); returns the best k (ties to the smaller). With
 * g_perfect, also the best G(k) of a draft accepted at every position, and *measured whether the
 * times are the host's measurements (not the priors). */
static int32_t predict(const steward_policy* self, const steward_spec_seq* seq, int32_t k_top, double* g,
                       double* g_perfect, int* measured) {
    const double t0_host = SEQ_FIELD(seq, plain_step_ms, -1.0);
    const double t0 = t0_host > 0 ? t0_host : 1.0; /* unmeasured: times in units of the plain step */
    const double cv_host = SEQ_FIELD(seq, verify_ms_per_token, -1.0);
    const double cv = t0_host > 0 && cv_host >= 0 ? cv_host : self->verify_share * t0;
    const int32_t source = SEQ_FIELD(seq, draft_source, (int32_t)STEWARD_SPEC_SOURCE_DRAFT);
    const double cd_host = SEQ_FIELD(seq, draft_ms_per_token, -1.0);
    /* A draft model drafts one sequence at a time: its prior is a share of a one-token target step
     * (the plain step less the other sequences' tokens), not of the whole batch's step. */
    double t1 = t0 - cv * (seq->batch_size > 1 ? (double)(seq->batch_size - 1) : 0.0);
    if (t1 < 0.1 * t0) t1 = 0.1 * t0;
    const double cd = t0_host > 0 && cd_host >= 0 ? cd_host
                      : source == STEWARD_SPEC_SOURCE_NGRAM || source == STEWARD_SPEC_SOURCE_SUFFIX ? 0.0
                                                            : self->draft_share * t1;
    const double others = seq->batch_size > 1 ? (double)(seq->batch_size - 1) : 0.0;
    /* A draft model's catch-up (C ms before its first draft token, paid once) is amortized over the
     * tokens left: a step that yields E(k) of them bears E(k) / left of it. Unmeasured: none. */
    const double cu_host = SEQ_FIELD(seq, draft_catch_up_ms, 0.0);
    const double cu = cu_host > 0 ? cu_host : 0.0;
    const double left = seq->max_tokens > seq->n_generated ? (double)(seq->max_tokens - seq->n_generated) : 0.0;
    double e = 1.0, run = 1.0, perfect = 0.0;
    int32_t best = 0;
    for (int32_t k = 0; k <= k_top; k++) {
        if (k > 0) e += (run *= acceptance_at(self, seq, k - 1));
        g[k] = (others + e) / (t0 + (double)k * (cv + cd) + (k > 0 ? catch_up_share(cu, e, left) : 0.0));
        if (g[k] > g[best]) best = k;
        const double ep = 1.0 + (double)k;
        const double gp = (others + ep) / (t0 + (double)k * (cv + cd) + catch_up_share(cu, ep, left));
        if (k > 0 && gp > perfect) perfect = gp;
    }
    if (g_perfect) *g_perfect = perfect;
    if (measured) *measured = t0_host > 0 && cd_host >= 0; /* c_verify may still be its prior share */
    return best;
}

/* This sequence's own plain rate within the batch: G(0) / B. */
static double own_rate(const steward_spec_seq* seq, const double* g) {
    return g[0] / (double)(seq->batch_size > 1 ? seq->batch_size : 1);
}

static int adaptive_draft_budget_seq(steward_policy* self, const steward_spec_seq* seq, int32_t* budget) {
    int32_t k_top = self->k_max < seq->max_budget ? self->k_max : seq->max_budget;
    if (seq->max_tokens > 0) {
        const int32_t left = seq->max_tokens - seq->n_generated - 1; /* the verification adds one */
        if (k_top > left) k_top = left;
    }
    if (k_top > ADAPTIVE_K_LIMIT) k_top = ADAPTIVE_K_LIMIT;
    if (k_top <= 0) {
        *budget = 0;
        return STEWARD_PLUGIN_OK;
    }
    double g[ADAPTIVE_K_LIMIT + 1], g_perfect = 0.0;
    int measured = 0;
    int32_t best = predict(self, seq, k_top, g, &g_perfect, &measured);
    const double own = own_rate(seq, g);
    if (best > 0 && g[best] - g[0] < (self->min_gain - 1.0) * own) best = 0;
    const int hopeless = measured && g_perfect - g[0] < (self->min_gain - 1.0) * own;

    adaptive_slot* s = &self->slots[seq->request_id % ADAPTIVE_SLOTS];
    if (s->request_id != seq->request_id || seq->request_id == 0) { /* its first step: no history */
        s->request_id = seq->request_id;
        s->k = best;
        s->n_better = 0;
        s->n_at_zero = 0;
        s->probe_gap = 0;
    } else {
        if (s->k > k_top) s->k = k_top;
        if (s->k > 0 && g[s->k] < g[0]) {
            /* Speculating at a predicted loss: stop at once (the loss is paid every step waited). */
            s->k = 0;
            s->n_better = 0;
        } else if (best != s->k && g[best] - g[s->k] > self->margin * own) {
            if (++s->n_better >= self->patience) {
                s->k = best;
                s->n_better = 0;
                if (best > 0) s->probe_gap = 0; /* drafts pay again: probe soon after the next stop */
            }
        } else {
            s->n_better = 0;
        }
    }
    int32_t k = s->k;
    if (k == 0) {
        if (hopeless) {
            s->n_at_zero = 0; /* no acceptance would pay at these times: nothing to learn by probing */
        } else if (self->probe_every > 0) {
            /* Until the host has measured a draft token's cost, the first wait is one step: a probe
             * right after stopping catches up on few tokens and measures it (then `hopeless` can
             * tell); a probe after probe_every steps would catch up on all of them first. */
            if (s->probe_gap <= 0) s->probe_gap = measured ? self->probe_every : 1;
            if (++s->n_at_zero >= s->probe_gap) {
                s->n_at_zero = 0;
                k = self->probe_k < k_top ? self->probe_k : k_top;
                const double next = (double)s->probe_gap * self->probe_backoff;
                const int32_t cap = self->probe_every_max > self->probe_every ? self->probe_every_max : self->probe_every;
                s->probe_gap = next >= (double)cap ? cap : (int32_t)next;
            }
        }
    } else {
        s->n_at_zero = 0;
    }
    *budget = k;
    return STEWARD_PLUGIN_OK;
}

/* ABI 1's per-bucket question: the best k for a sequence with the bucket's mean acceptance. */
static int adaptive_draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    steward_spec_seq q;
    memset(&q, 0, sizeof q);
    q.size = (uint32_t)offsetof(steward_spec_seq, accept_pos); /* no goodput fields */
    q.max_budget = stats->max_budget;
    q.batch_size = stats->batch_size;
    q.recent_acceptance = -1;
    int32_t k_top = self->k_max < stats->max_budget ? self->k_max : stats->max_budget;
    if (k_top > ADAPTIVE_K_LIMIT) k_top = ADAPTIVE_K_LIMIT;
    if (k_top <= 0) {
        *budget = 0;
        return STEWARD_PLUGIN_OK;
    }
    double g[ADAPTIVE_K_LIMIT + 1];
    int32_t best = predict(self, &q, k_top, g, NULL, NULL);
    if (best > 0 && g[best] - g[0] < (self->min_gain - 1.0) * own_rate(&q, g)) best = 0;
    *budget = best;
    return STEWARD_PLUGIN_OK;
}

static const steward_speculation_table table = {
    .version = STEWARD_SPECULATION_TABLE_VERSION,
    .size = sizeof(steward_speculation_table),
    .create = adaptive_create,
    .destroy = adaptive_destroy,
    .draft_budget = adaptive_draft_budget,
    .draft_budget_seq = adaptive_draft_budget_seq,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_SPECULATION, "adaptive", "the draft length with the best predicted goodput",
                table)
