// Synthetic models by preset name.
#include "model/model.h"
#include "util/error.h"

#include <gtest/gtest.h>

using namespace peregrine;

namespace {

// The presets' config.json reads back as the preset at every size, so a written preset loads as serve --synthetic.
TEST(SyntheticPresets, ConfigJsonReadsBack) {
    for (int layers : {1, 2, 3, 4, 5, 6, 40})
        EXPECT_TRUE(parse_model_config(model_config_json(synthetic_preset_config("v41-flash", layers, 96))) ==
                    synthetic_preset_config("v41-flash", layers, 96))
            << layers;
    for (int layers : {1, 2, 3, 4, 43})
        EXPECT_TRUE(parse_model_config(model_config_json(synthetic_preset_config("v4-flash", layers))) ==
                    synthetic_preset_config("v4-flash", layers))
            << layers;
    EXPECT_EQ(synthetic_preset_config("v41-flash", 2).n_routed_experts, 384);
    EXPECT_EQ(synthetic_preset_config("v4-flash", 2).n_routed_experts, 256);
    EXPECT_EQ(synthetic_preset_config("v4-flash", 43).n_hash_layers, 3);
    EXPECT_THROW(synthetic_preset_config("v5-flash", 2), Error);
    EXPECT_THROW(synthetic_preset_config("v4-flash", 44), Error);
    // One field a release has no key for (V4.1's activation block is fixed) is refused, not written wrong.
    ModelConfig c = synthetic_preset_config("v41-flash", 2);
    c.act_block = 128;
    EXPECT_THROW(model_config_json(c), Error);
}

}  // namespace
