#pragma once
// The OpenAI-compatible and native HTTP API over an Engine: /v1/chat/completions, /v1/completions,
// /v1/models, /generate, /health, /metrics, /flush_cache, and Anthropic's /v1/messages (+ /count_tokens).
#include "engine/engine.h"
#include "server/http_server.h"
#include "server/protocol/chat_format.h"
#include "server/scripted_output.h"
#include "server/structured_output.h"

#include <chrono>
#include <memory>
#include <string>

namespace peregrine {

struct ApiOptions {
    std::string served_model_name;
    std::string api_key;            // non-empty: every route but /health needs "Authorization: Bearer KEY"
    ChatFormat chat_format = ChatFormat::deepseek_v41;
    bool default_thinking = false;  // thinking off unless the request asks for it
    int64_t default_max_tokens = 0; // 0: up to the context length
    SamplingParams sampling_defaults;  // for the fields a request leaves out (--sampling-defaults)
    size_t max_body_bytes = 32u << 20;
    int max_connections = 4096;     // open HTTP connections; beyond, 503
    std::string server_info = "{}";  // GET /server_info: the launch configuration, a JSON object
    std::chrono::milliseconds health_generate_timeout{20000};
    GrammarCompileOptions grammar;  // compile threads, queue and time budget for request grammars
    // Testing aid: completions forced token by token (see scripted_output.h); null in normal serving.
    std::shared_ptr<ScriptedOutput> scripted_output;
};

class ApiServer {
public:
    ApiServer(Engine& engine, const Tokenizer& tok, ApiOptions opts);
    ~ApiServer();
    int bind(const std::string& host, int port);
    void run();
    void stop();
    // Graceful shutdown's first half: new generations get 503, those in flight get up to `timeout` to finish,
    // the rest are cancelled. Returns how many were cancelled.
    int drain(std::chrono::milliseconds timeout);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Prometheus text exposition of the engine's metrics (names mirror SGLang's, prefix "peregrine:").
std::string prometheus_text(const EngineStats& s, const std::string& model_name);

}  // namespace peregrine
