// The opening of a Hugging Face config.json, one for GPT-2's reader (hf_gpt2.cpp) and the other
// architectures' (hf_models.cpp): the text parsed, or one line naming `source` and the cause.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace hl {

// `text` as a JSON object; fails "<source>: not valid JSON (...)" or "<source>: not a JSON object".
nlohmann::json parse_config_object(const std::string& text, const std::string& source);

}  // namespace hl
