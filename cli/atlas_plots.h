// Draws grad_atlas.png and attn_entropy.png into the atlas's directory (gnuplot).
#pragma once
#include "train/atlas.h"

namespace hl {

void draw_gradient_atlas(const GradAtlas& atlas);

}  // namespace hl
