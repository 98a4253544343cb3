// State entries in the released byte formats (kv/entry_format.h): every value the model stores was QDQ'd, so
// packing is lossless; checked on the quantisers' outputs over many magnitudes and on the fixtures' real state.
#include "engine/sequence_runner.h"
#include "kv/page_pool.h"
#include "model/fixture.h"
#include "model/model.h"
#include "kv/entry_format.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace peregrine {
namespace {

using test::fixture_dir;
using test::read_ids;

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// decode(encode(x)) == x bit for bit (signed zeros included); false if the encoder refused.
bool round_trips(const EntryFormat& f, const std::vector<float>& x, int64_t* mismatches) {
    std::vector<uint8_t> e(static_cast<size_t>(f.bytes));
    if (!encode_entry(f, x.data(), e.data())) return false;
    std::vector<float> y(static_cast<size_t>(f.dim));
    decode_entry(f, e.data(), y.data());
    for (int c = 0; c < f.dim; ++c) *mismatches += bits(x[static_cast<size_t>(c)]) != bits(y[static_cast<size_t>(c)]);
    return true;
}

TEST(StateFormat, EntrySizesAreTheReleasedOnes) {
    const EntryFormat w41 = fp8_entry_format(512, 512, 32), c41 = fp4_entry_format(512, 16, true),
                      k = fp4_entry_format(128, 32, false), w4 = fp8_entry_format(512, 448, 64);
    EXPECT_EQ(w41.bytes, 528);  // 512 e4m3 + 16 ue8m0
    EXPECT_EQ(c41.bytes, 288);  // 256 e2m1 pairs + 32 e4m3
    EXPECT_EQ(k.bytes, 80);     // 64 + 4 ue8m0, padded to 16 bytes
    EXPECT_EQ(w4.bytes, 592);   // 448 e4m3 + 64 bf16 + 7 ue8m0, padded
    EXPECT_EQ(w4.bf16_offset, 448);
    EXPECT_EQ(w4.scale_offset, 576);

    // V4.1-Flash's layout: window 528 B per token per layer, the sources' latents and keys per group.
    const ModelConfig cfg = synthetic_v41_flash_config(4);
    const StateLayout L = make_state_layout(cfg, 64);
    const auto infos = attention_layer_infos(cfg);
    for (size_t l = 0; l < infos.size(); ++l) {
        EXPECT_EQ(L.layers[l].window.entry_bytes, 528u);
        if (infos[l].compresses) {
            EXPECT_EQ(L.layers[l].comp.entry_bytes, 288u);
        }
        if (L.layers[l].index_k.present()) {
            EXPECT_EQ(L.layers[l].index_k.entry_bytes, 80u);
        }
        for (const StateSection* s : {&L.layers[l].window, &L.layers[l].comp, &L.layers[l].index_k})
            EXPECT_EQ(s->offset % 16, 0u);
    }
    // Layers 0 (window), 1 (ratio-2 source), 2 (reuse), 3 (ratio-1 source): 4 x 528 + 288/2 + 80/2 + 288 + 80.
    double per_token = 0;
    for (const auto& ll : L.layers)
        for (const StateSection* s : {&ll.window, &ll.comp, &ll.index_k})
            if (s->present()) per_token += static_cast<double>(s->entry_bytes) / s->per_entry_tokens;
    EXPECT_EQ(per_token, 4 * 528 + 144 + 40 + 288 + 80);
    std::printf("V4.1-Flash 4-layer state: %.0f B/token (pages of 64 tokens: %zu B)\n", per_token, L.row_bytes());
}

// The quantisers' outputs at magnitudes from 2^-40 to 2^12, with zeros, signed zeros, single spikes and blocks
// at the quantisers' amax floors: always held exactly.
TEST(StateFormat, QuantisedValuesRoundTripExactly) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    struct Case {
        EntryFormat f;
        void (*qdq)(float*, int);
    };
    const Case cases[] = {
        {fp8_entry_format(512, 512, 32), [](float* x, int n) { qdq_fp8(x, n, 32); }},
        {fp8_entry_format(512, 448, 64), [](float* x, int) { qdq_fp8(x, 448, 64); }},
        {fp4_entry_format(512, 16, true), [](float* x, int n) { qdq_fp4_e4m3(x, n, 16); }},
        {fp4_entry_format(128, 32, false), [](float* x, int n) { qdq_fp4_ue8m0(x, n, 32); }},
    };
    for (const Case& c : cases) {
        int64_t mismatches = 0, refused = 0;
        for (int trial = 0; trial < 400; ++trial) {
            std::vector<float> x(static_cast<size_t>(c.f.dim));
            const float mag = std::ldexp(1.0f, -40 + (trial % 53));
            for (auto& v : x) v = round_bf16(normal(rng) * mag);
            if (trial % 7 == 0)  // sparse: mostly zeros (and negative zeros), a few spikes
                for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 37 == 3) ? x[i] * 64.0f : (i % 2 ? -0.0f : 0.0f);
            if (trial % 11 == 0)  // blocks far apart in scale
                for (size_t i = 0; i < x.size(); ++i)
                    x[i] = round_bf16(x[i] * std::ldexp(1.0f, static_cast<int>(i / 32) * 5 - 20));
            for (int c2 = c.f.quant_dims; c2 < c.f.dim; ++c2) x[static_cast<size_t>(c2)] = round_bf16(normal(rng));
            c.qdq(x.data(), c.f.dim);
            if (!round_trips(c.f, x, &mismatches)) ++refused;
        }
        EXPECT_EQ(refused, 0) << "kind " << c.f.kind << " block " << c.f.block;
        EXPECT_EQ(mismatches, 0) << "kind " << c.f.kind << " block " << c.f.block;
    }
}

// Values that are not on a format's grid are refused (the encoder checks, it does not round).
TEST(StateFormat, RefusesValuesItCannotHold) {
    int64_t mismatches = 0;
    std::vector<float> x(512, 1.0f);
    x[5] = 1.0625f;  // needs four mantissa bits: not e4m3 under any power-of-two scale shared with 1.0
    EXPECT_FALSE(round_trips(fp8_entry_format(512, 512, 32), x, &mismatches));
    std::vector<float> y(512, 1.0f);
    y[511] = 1.0078125f;  // a bf16 RoPE dim is fine...
    EXPECT_TRUE(round_trips(fp8_entry_format(512, 448, 64), y, &mismatches));
    y[511] = 1.0000001f;  // ...an fp32 one is not
    EXPECT_FALSE(round_trips(fp8_entry_format(512, 448, 64), y, &mismatches));
    std::vector<float> z(128, 1.0f);
    z[0] = 1.25f;  // not an e2m1 multiple of 1.0's scale
    EXPECT_FALSE(round_trips(fp4_entry_format(128, 32, false), z, &mismatches));
    std::vector<float> u(512, 0.0f);
    u[0] = 6.0f;
    u[1] = 0.1f;  // 6 and 0.1 share no e4m3 scale on the e2m1 grid
    EXPECT_FALSE(round_trips(fp4_entry_format(512, 16, true), u, &mismatches));
    EXPECT_EQ(mismatches, 0);
}

// The fixtures' real state after a prefill: every stored entry is the canonical encoding of its values
// (re-encoding the decoded values gives the same bytes), and the values survive another round trip.
TEST(StateFormat, FixtureStateIsCanonical) {
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) {
        auto model = Model::load(fixture_dir(fx));
        auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
        const int n = static_cast<int>(ids.size());
        const StateLayout& L = model->layout();
        PagePool pool(model->backend().state_memory(), L, L.pages_for(n) + 1);
        SeqState st;
        pool.init(st);
        ASSERT_TRUE(pool.reserve(st, n));
        ForwardBatch b;
        b.seqs.push_back({&st, 0, n, 0});
        b.token_ids = ids;
        b.mode = batch_mode_of(b);
        model->forward(b, {});
        int64_t checked = 0, nonzero = 0, mismatches = 0;
        const auto infos = attention_layer_infos(model->config());
        for (size_t l = 0; l < L.layers.size(); ++l) {
            const LayerStateLayout& ll = L.layers[l];
            const int ratio = l < infos.size() ? infos[l].ratio : 0;
            const std::pair<const StateSection*, int64_t> secs[] = {
                {&ll.window, n}, {&ll.comp, ratio > 0 ? n / ratio : 0}, {&ll.index_k, ratio > 0 ? n / ratio : 0}};
            for (auto [sec, count] : secs) {
                if (!sec->present()) continue;
                for (int64_t j = 0; j < count; ++j) {
                    const uint8_t* e = L.entry<uint8_t>(st, *sec, j);
                    std::vector<float> v(static_cast<size_t>(sec->format.dim));
                    decode_entry(sec->format, e, v.data());
                    std::vector<uint8_t> again(static_cast<size_t>(sec->format.bytes));
                    ASSERT_TRUE(encode_entry(sec->format, v.data(), again.data())) << fx << " layer " << l;
                    EXPECT_EQ(0, std::memcmp(again.data(), e, again.size())) << fx << " layer " << l << " entry " << j;
                    ASSERT_TRUE(round_trips(sec->format, v, &mismatches));
                    for (float x : v) nonzero += x != 0.0f;
                    ++checked;
                }
            }
        }
        EXPECT_EQ(mismatches, 0) << fx;
        EXPECT_GT(checked, n) << fx;
        EXPECT_GT(nonzero, checked) << fx;  // real activations, not empty pages
        pool.release(st);
    }
}

}  // namespace
}  // namespace peregrine
