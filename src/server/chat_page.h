// The web chat page served at `/`: one self-contained HTML document (CSS and JavaScript inline, nothing
// fetched from elsewhere) that talks to this server's own API: /v1/models for the model's name and context
// size, /v1/chat/completions streamed over SSE for answers.
#pragma once

#include <string_view>

namespace ms::server {

std::string_view chat_page_html();

}  // namespace ms::server
