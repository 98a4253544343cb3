#include "server/api_server.h"
#include "server/anthropic_api.h"
#include "server/protocol/assistant_message.h"
#include "server/protocol/chat_request.h"
#include "server/protocol/output_parser.h"
#include "server/protocol/prompt_render.h"
#include "server/request_params.h"
#include "server/request_registry.h"
#include "server/response_streams.h"
#include "server/route_requests.h"
#include "server/scripted_output.h"
#include "server/structured_output.h"
#include "server/tool_call_grammar.h"
#include "tokenizer/utf8.h"
#include "util/json_depth.h"
#include "util/log.h"

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

namespace peregrine {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string random_id(const char* prefix) {
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 rng(std::random_device{}());
    return fmt::format("{}{:016x}{:04x}", prefix, rng(), counter++ & 0xffff);
}

void set_error(HttpResponse& res, const ApiError& e) {
    res.status = e.status();
    res.content_type = "application/json";
    res.body = dump(e.to_json());
}

// Prompt tokens served from the prefix cache, and of them those brought back from host memory and storage.
struct CachedTokens {
    int64_t total = 0, host = 0, storage = 0;
    static CachedTokens of(const RequestDelta& d) { return {d.cached_tokens, d.cached_host, d.cached_storage}; }
    void add(const RequestDelta& d) { total += d.cached_tokens, host += d.cached_host, storage += d.cached_storage; }
    json details() const { return {{"device", total - host - storage}, {"host", host}, {"storage", storage}}; }
};

json usage_json(int64_t prompt, int64_t completion, const CachedTokens& cached) {
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details",
             {{"cached_tokens", cached.total}, {"cached_tokens_details", cached.details()}}}};
}

// Adds tool-call delta entries to a chunk's list: one entry per call index, argument fragments joined.
void merge_tool_calls(json& into, const json& add) {
    for (auto& x : add) {
        json* same = nullptr;
        for (auto& y : into)
            if (y.value("index", -1) == x.value("index", -2)) same = &y;
        if (!same) {
            into.push_back(x);
            continue;
        }
        for (auto& [k, v] : x.items()) {
            if (k != "function") {
                (*same)[k] = v;
                continue;
            }
            json& f = (*same)["function"];
            for (auto& [fk, fv] : v.items())
                if (fk == "arguments" && f.contains("arguments"))
                    f["arguments"] = f["arguments"].get<std::string>() + fv.get<std::string>();
                else f[fk] = fv;
        }
    }
}

const char* finish_name(const RequestDelta& d) {
    return d.finish == FinishReason::length ? "length" : d.finish == FinishReason::abort ? "abort" : "stop";
}

}  // namespace

struct ApiServer::Impl {
    Engine& engine;
    const Tokenizer& tok;
    ApiOptions opts;
    HttpServer http;
    RouteOptions route_opts;
    StructuredOutput structured;
    RequestRegistry inflight;
    std::atomic<bool> draining{false};  // shutting down: no new generations

    Impl(Engine& e, const Tokenizer& t, ApiOptions o)
        : engine(e), tok(t), opts(std::move(o)), http(make_http_options(opts)),
          structured(t, e.model().config().vocab_size, e.model().config().eos_token_id, opts.grammar) {
        route_opts.served_model_name = opts.served_model_name;
        route_opts.chat_format = opts.chat_format;
        route_opts.default_thinking = opts.default_thinking;
        route_opts.limits.vocab = engine.model().config().vocab_size;
        route_opts.limits.context_length = engine.context_length();
        route_opts.limits.default_max_tokens = opts.default_max_tokens;
        route_opts.limits.sampling_defaults = opts.sampling_defaults;
        route("GET", "/health", [this](const HttpRequest&, HttpResponse& r) { health(r); }, false);
        route("GET", "/health_generate", [this](const HttpRequest&, HttpResponse& r) { health_generate(r); }, false);
        route("GET", "/v1/models", [this](const HttpRequest&, HttpResponse& r) { models(r); });
        route("GET", "/metrics", [this](const HttpRequest&, HttpResponse& r) {
            r.content_type = "text/plain; version=0.0.4";
            r.body = prometheus_text(engine.stats(), opts.served_model_name);
        });
        // SGLang's names for the same document.
        for (const char* path : {"/server_info", "/get_server_info"})
            route("GET", path, [this](const HttpRequest&, HttpResponse& r) { server_info(r); });
        route("POST", "/abort_request", [this](const HttpRequest& q, HttpResponse& r) { abort_request(q, r); });
        route("POST", "/flush_cache", [this](const HttpRequest&, HttpResponse& r) {
            r.body = dump(json{{"flushed_pages", engine.flush_cache()}});
        });
        route("POST", "/v1/completions", [this](const HttpRequest& q, HttpResponse& r) { completions(q, r); });
        route("POST", "/v1/chat/completions", [this](const HttpRequest& q, HttpResponse& r) { chat(q, r); });
        route("POST", "/generate", [this](const HttpRequest& q, HttpResponse& r) { generate(q, r); });
        route("POST", "/v1/messages", [this](const HttpRequest& q, HttpResponse& r) { messages(q, r); }, true, true);
        route(
            "POST", "/v1/messages/count_tokens", [this](const HttpRequest& q, HttpResponse& r) { count_tokens(q, r); },
            true, true);
    }

    static HttpServerOptions make_http_options(const ApiOptions& o) {
        HttpServerOptions h;
        h.max_body_bytes = o.max_body_bytes;
        h.max_connections = o.max_connections;
        h.error_body = [](int status) {
            auto err = [](const char* msg, const char* code) {
                return dump(error_json(msg, "invalid_request_error", "", code));
            };
            switch (status) {
                case 400: return err("malformed HTTP request", "bad_request");
                case 404: return err("no such route", "not_found");
                case 405: return err("method not allowed on this route (see the Allow header)", "method_not_allowed");
                case 413: return err("the request body is too large", "request_too_large");
                case 415: return err("unsupported Content-Encoding (gzip, deflate and identity are)",
                                     "unsupported_media_type");
                case 431: return err("the request headers are too large", "headers_too_large");
                case 503: return dump(error_json("too many open connections (--max-connections)",
                                                 "service_unavailable", "", "too_many_connections"));
                default: return err(fmt::format("HTTP {}", status).c_str(), "");
            }
        };
        return h;
    }

    // `anthropic`: errors in Anthropic's shape ({"type": "error", "error": {"type", "message"}}), and the
    // key may also come as "x-api-key".
    void route(const std::string& method, const std::string& path, HttpHandler h, bool auth = true,
               bool anthropic = false) {
        auto error = [this, anthropic](HttpResponse& r, const ApiError& e) {
            if (!anthropic) return set_error(r, e);
            r.status = e.status();
            r.content_type = "application/json";
            r.body = dump(anthropic_error_json(e.status(), e.what()));
        };
        // The key is checked on the headers, before the body is read.
        HttpGate gate;
        if (auth && !opts.api_key.empty())
            gate = [this, anthropic, error](const HttpRequest& q, HttpResponse& r) {
                if (q.header("Authorization") == "Bearer " + opts.api_key ||
                    (anthropic && q.header("x-api-key") == opts.api_key))
                    return true;
                error(r, ApiError(401, "invalid or missing API key", "", "authentication_error", "invalid_api_key"));
                return false;
            };
        http.route(method, path, [h, error, anthropic](const HttpRequest& q, HttpResponse& r) {
            try {
                h(q, r);
            } catch (const ApiError& e) {
                error(r, e);
            } catch (const RequestError& e) {
                error(r, ApiError(400, anthropic && !e.param().empty() ? e.param() + ": " + e.what() : e.what(),
                                  e.param()));
            } catch (const QueueFullError& e) {
                error(r, ApiError(anthropic ? 529 : 429, e.what(), "", "rate_limit_exceeded", "queue_full"));
            } catch (const std::exception& e) {
                spdlog::error("{} {}: {}", q.method, q.path, e.what());
                error(r, ApiError(500, e.what(), "", "server_error"));
            }
        }, gate);
    }

    void health(HttpResponse& r) {
        if (draining) {
            r.status = 503;
            r.body = R"({"status":"shutting down"})";
            return;
        }
        r.body = R"({"status":"ok"})";
    }

    // Proves the engine runs: one generated token within the timeout (SGLang's /health_generate).
    void health_generate(HttpResponse& r) {
        const auto t0 = std::chrono::steady_clock::now();
        GenerationParams g;
        g.sampling.temperature = 0.0f;
        g.max_new_tokens = 1;
        g.ignore_eos = true;
        std::shared_ptr<RequestStream> s;
        try {
            if (!draining) s = engine.submit({0}, g);
        } catch (const Error&) {  // a full queue: the engine is busy, not healthy enough to take one more
        }
        RequestDelta d;
        const bool done = s && s->wait_for(d, opts.health_generate_timeout);
        if (s && !done) s->cancel();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const bool ok = done && d.finish != FinishReason::error && d.completion_tokens == 1;
        r.status = ok ? 200 : 503;
        r.body = dump(json{{"status", ok ? "ok" : draining ? "shutting down" : "unhealthy"}, {"ms", ms}});
    }

    // The launch configuration, then the queue and the state memory as they are now.
    void server_info(HttpResponse& r) {
        json info = json::parse(opts.server_info);
        const EngineStats st = engine.stats();
        info["status"] = draining ? "shutting down" : "serving";
        info["num_running_reqs"] = st.running;
        info["num_queue_reqs"] = st.queued;
        info["state"] = {{"pages_total", st.pages_total},     {"pages_used", st.pages_used},
                         {"pages_cached", st.pages_cached},   {"window_pages_total", st.window_pages_total},
                         {"window_pages_used", st.window_pages_used}, {"window_pages_cached", st.window_pages_cached},
                         {"token_usage", st.token_usage},     {"cache_hit_rate", st.cache_hit_rate}};
        if (engine.options().speculative_draft_tokens > 0)  // SGLang's avg_spg_accept_length: tokens per verify
            info["avg_spec_accept_length"] =
                st.spec_verify_total ? st.spec_accept_length.sum / static_cast<double>(st.spec_verify_total) : 0.0;
        r.body = dump(info);
    }

    // SGLang's /abort_request: {"rid": ID} cancels that request (an OpenAI response id, or /generate's rid);
    // {"abort_all": true} cancels every one.
    void abort_request(const HttpRequest& q, HttpResponse& r) {
        ojson body = parse_body(q.body);
        const bool all = get_bool(body, "abort_all").value_or(false);
        auto it = body.find("rid");
        if (!all && (it == body.end() || !it->is_string()))
            throw ApiError(400, "give 'rid' (a string) or 'abort_all': true", "rid");
        r.body = dump(json{{"aborted", inflight.abort(all ? std::string() : it->get<std::string>())}});
    }

    // Stops admitting generations, waits up to `timeout` for those in flight, cancels the rest; returns how many
    // were cancelled.
    int drain(std::chrono::milliseconds timeout) {
        draining = true;
        const auto end = std::chrono::steady_clock::now() + timeout;
        while (inflight.alive() > 0 && std::chrono::steady_clock::now() < end)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const int cancelled = inflight.abort("");
        // Their streams send the final chunk (finish_reason "abort") and let go.
        for (int i = 0; i < 100 && inflight.alive() > 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return cancelled;
    }

    void models(HttpResponse& r) {
        json m = {{"id", opts.served_model_name},
                  {"object", "model"},
                  {"created", unix_now()},
                  {"owned_by", "peregrine"},
                  {"root", opts.served_model_name},
                  {"max_model_len", engine.context_length()},
                  {"vocab_size", engine.model().config().vocab_size}};
        r.body = dump(json{{"object", "list"}, {"data", json::array({m})}});
    }

    std::shared_ptr<RequestStream> submit(std::vector<int32_t> ids, GenerationParams g, const char* param) {
        if (draining) throw ApiError(503, "the server is shutting down", {}, "service_unavailable");
        try {
            return engine.submit(std::move(ids), std::move(g));
        } catch (const QueueFullError&) {
            throw;
        } catch (const Error& e) {
            throw ApiError(400, e.what(), param);
        }
    }

    std::vector<int32_t> encode_text(const std::string& text) const { return tok.encode(text, true, true); }

    // Compiles a request's constraint on a compile thread (cached), so the engine loop never waits on it; errors
    // (bad syntax, unsupported schema features) are 400s naming `param`.
    std::shared_ptr<const grammar::CompiledGrammar> compile_constraint(
        const std::optional<grammar::ConstraintSpec>& spec, const std::string& param, const HttpRequest& q) {
        if (!spec) return nullptr;
        return compile_guarded(param, "invalid " + param, [&] { return structured.compile(*spec, q.client_gone); });
    }

    // Maps compilation errors to API errors: too complex (a limit passed) and malformed are 400s naming `param`,
    // a full compile queue is a 429.
    template <typename F>
    std::shared_ptr<const grammar::CompiledGrammar> compile_guarded(const std::string& param,
                                                                   const std::string& what, F&& compile) {
        try {
            return compile();
        } catch (const ApiError&) {
            throw;
        } catch (const CompileQueueFull& e) {
            throw ApiError(429, e.what(), "", "rate_limit_exceeded", "grammar_queue_full");
        } catch (const grammar::CompileCancelled&) {
            throw ApiError(400, "the client closed the connection while its grammar compiled", param);
        } catch (const grammar::GrammarTooComplex& e) {
            // The time limit is this server's setting: name its flag.
            const char* flag = e.time_limit() ? " (--grammar-compile-timeout)" : "";
            throw ApiError(400, fmt::format("{}: {}{}", what, e.what(), flag), param, "invalid_request_error",
                           "grammar_too_complex");
        } catch (const Error& e) {
            throw ApiError(400, fmt::format("{}: {}", what, e.what()), param);
        }
    }

    // tool_choice required / a named function: the DSML grammar of the allowed calls (nullptr otherwise).
    std::shared_ptr<const grammar::CompiledGrammar> tool_choice_grammar(const ChatRequest& req, const HttpRequest& q) {
        if (req.tool_choice.mode != ToolChoiceMode::required && req.tool_choice.mode != ToolChoiceMode::named)
            return nullptr;
        const std::string key = tool_call_grammar_key(req, opts.chat_format);
        return compile_guarded("tools", "invalid tools", [&] {
            return structured.compile_tool_calls(key, [&] { return tool_call_grammar(req, opts.chat_format); },
                                                 q.client_gone);
        });
    }

    // A grammar per sequence: each choice of an n > 1 request has its own matcher.
    void constrain(GenerationParams& g, const std::shared_ptr<const grammar::CompiledGrammar>& grammar) const {
        if (grammar) g.processor = structured.processor(grammar, g.max_new_tokens);
    }

    // Logprobs of one token in the chat format.
    json chat_logprob(const TokenOutput& t) const {
        auto entry = [&](int32_t id, float lp) {
            std::string bytes = tok.is_valid(id) ? tok.token_bytes(id) : std::string();
            json b = json::array();
            for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
            return json{{"token", bytes}, {"logprob", lp}, {"bytes", b}};
        };
        json e = entry(t.id, t.logprob);
        json top = json::array();
        for (auto& x : t.top) top.push_back(entry(x.id, x.logprob));
        e["top_logprobs"] = top;
        return e;
    }

    // ---- /v1/completions -------------------------------------------------------------------------------

    void completions(const HttpRequest& q, HttpResponse& res) {
        CompletionsRequest cr = parse_completions_request(q.body, route_opts);
        std::vector<std::vector<int32_t>> prompts;
        for (auto& p : cr.prompts) prompts.push_back(p.is_text() ? encode_text(p.text) : std::move(p.ids));
        const GenerationParams& g = cr.params;
        const int n = cr.n;
        const auto grammar = compile_constraint(cr.constraint, "response_format", q);
        const bool stream = cr.stream, include_usage = cr.include_usage;

        std::vector<std::shared_ptr<RequestStream>> streams;
        try {
            for (auto& p : prompts)
                for (int i = 0; i < n; ++i) {
                    GenerationParams gi = g;
                    if (gi.sampling.seed >= 0) gi.sampling.seed += i;
                    constrain(gi, grammar);
                    streams.push_back(submit(p, gi, "prompt"));
                }
        } catch (...) {
            for (auto& s : streams) s->cancel();
            throw;
        }
        const std::string id = random_id("cmpl-");
        inflight.add(id, streams);
        const int64_t created = unix_now();
        auto lp_json = [&](const std::vector<TokenOutput>& toks, size_t offset0) {
            json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
            size_t off = offset0;
            for (auto& t : toks) {
                tokens.push_back(t.text);
                lps.push_back(t.logprob);
                json top = json::object();
                for (auto& x : t.top)
                    top[tok.is_valid(x.id) ? tok.token_bytes(x.id) : std::to_string(x.id)] = x.logprob;
                tops.push_back(top);
                offs.push_back(off);
                off += t.text.size();
            }
            return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
        };
        if (!stream) {
            const std::string model = opts.served_model_name;
            const bool want_lp = g.logprobs;
            respond_when_done(res, streams, [id, created, model, want_lp, lp_json, n](std::vector<RequestDelta>& ds) {
                json choices = json::array();
                int64_t prompt_tokens = 0, completion = 0;
                CachedTokens cached;
                for (size_t i = 0; i < ds.size(); ++i) {
                    const RequestDelta& d = ds[i];
                    if (d.finish == FinishReason::error) throw ApiError(500, d.error, "", "server_error");
                    json c = {{"index", i}, {"text", d.text}, {"logprobs", nullptr}, {"finish_reason", finish_name(d)}};
                    if (!d.matched_stop.empty()) c["matched_stop"] = d.matched_stop;
                    if (want_lp) c["logprobs"] = lp_json(d.tokens, 0);
                    choices.push_back(c);
                    if (i % static_cast<size_t>(n) == 0) {
                        prompt_tokens += d.prompt_tokens;
                        cached.add(d);
                    }
                    completion += d.completion_tokens;
                }
                return dump(json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                                 {"choices", choices}, {"usage", usage_json(prompt_tokens, completion, cached)}});
            });
            return;
        }
        res.content_type = "text/event-stream";
        const std::string model = opts.served_model_name;
        const bool want_lp = g.logprobs;
        res.stream = openai_events(
            streams, "",
            [id, created, model, want_lp, lp_json](size_t i, const RequestDelta& d) {
                json c = {{"index", i}, {"text", d.text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
                if (want_lp && !d.tokens.empty()) c["logprobs"] = lp_json(d.tokens, 0);
                if (d.finished) c["finish_reason"] = finish_name(d);
                return json{{"id", id},
                            {"object", "text_completion"},
                            {"created", created},
                            {"model", model},
                            {"choices", json::array({c})}};
            },
            [id, created, model, include_usage, n](const std::vector<RequestDelta>& totals) {
                if (!include_usage) return json();
                int64_t p = 0, c = 0;
                CachedTokens k;
                for (size_t i = 0; i < totals.size(); ++i) {
                    if (i % static_cast<size_t>(n) == 0) {
                        p += totals[i].prompt_tokens;
                        k.add(totals[i]);
                    }
                    c += totals[i].completion_tokens;
                }
                return json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                            {"choices", json::array()}, {"usage", usage_json(p, c, k)}};
            });
    }

    // Non-streaming answers: when every request finishes within a second the answer is an ordinary
    // response (errors keep their status). Otherwise the body goes out chunked once ready, preceded by spaces
    // (which JSON ignores); a client that hangs up meanwhile cancels its requests.
    using BodyBuilder = std::function<std::string(std::vector<RequestDelta>&)>;
    void respond_when_done(HttpResponse& res, std::vector<std::shared_ptr<RequestStream>> streams, BodyBuilder build) {
        auto acc = std::make_shared<std::vector<RequestDelta>>(streams.size());
        if (collect(streams, *acc, std::chrono::milliseconds(1000))) {
            res.body = build(*acc);
            return;
        }
        res.stream = std::make_shared<DeferredBody>(std::move(streams), acc, [build](std::vector<RequestDelta>& ds) {
            try {
                return build(ds);
            } catch (const ApiError& e) {
                return dump(e.to_json());
            }
        });
    }

    // Streams several requests as SSE: one event per delta (an error event first when one failed), a usage event
    // when `usage` gives one, then [DONE]. The client leaving cancels every request at once.
    template <typename ChunkFn, typename UsageFn>
    static std::shared_ptr<BodyStream> openai_events(std::vector<std::shared_ptr<RequestStream>> streams,
                                                     std::string head, ChunkFn chunk, UsageFn usage) {
        auto on_delta = [chunk](size_t i, const RequestDelta& d) mutable {
            std::string out;
            if (d.finished && d.finish == FinishReason::error)
                out += "data: " + dump(error_json(d.error, "server_error", "", "")) + "\n\n";
            return out + "data: " + dump(chunk(i, d)) + "\n\n";
        };
        auto on_end = [usage](const std::vector<RequestDelta>& totals) mutable {
            json u = usage(totals);
            return (u.is_null() ? std::string() : "data: " + dump(u) + "\n\n") + "data: [DONE]\n\n";
        };
        return std::make_shared<EventStream>(std::move(streams), std::move(head), std::move(on_delta),
                                             std::move(on_end), ": keep-alive\n\n");
    }

    // ---- /v1/chat/completions ----------------------------------------------------------------------------

    std::vector<int32_t> encode_rendered(const RenderedPrompt& rp) const {
        std::vector<int32_t> ids;
        size_t pos = 0;
        auto plain = [&](size_t b, size_t e) {
            if (e <= b) return;
            auto v = tok.encode(std::string_view(rp.text).substr(b, e - b), false, false);
            ids.insert(ids.end(), v.begin(), v.end());
        };
        for (auto [b, e] : rp.special_ranges) {
            plain(pos, b);
            int32_t id = tok.token_id(std::string_view(rp.text).substr(b, e - b));
            if (id >= 0) ids.push_back(id);
            else plain(b, e);  // a tokenizer without DeepSeek's special tokens (byte-level) spells them out
            pos = e;
        }
        plain(pos, rp.text.size());
        return ids;
    }

    void chat(const HttpRequest& q, HttpResponse& res) {
        ChatRouteRequest cr = parse_chat_route_request(q.body, route_opts);
        const ChatRequest& req = cr.req;
        const std::vector<int32_t> prompt = encode_rendered(cr.prompt);
        const GenerationParams& g = cr.params;
        const int n = cr.n;
        auto grammar = compile_constraint(cr.constraint, "response_format", q);
        if (auto tg = tool_choice_grammar(req, q)) {
            if (grammar)
                throw ApiError(400, "response_format cannot be combined with tool_choice required or a named function",
                               "response_format");
            grammar = std::move(tg);
        }
        std::vector<std::shared_ptr<RequestStream>> streams;
        try {
            for (int i = 0; i < n; ++i) {
                GenerationParams gi = g;
                if (gi.sampling.seed >= 0) gi.sampling.seed += i;
                constrain(gi, grammar);
                if (opts.scripted_output) gi.processor = opts.scripted_output->next(tok);  // a testing aid wins
                streams.push_back(submit(prompt, gi, "messages"));
            }
        } catch (...) {
            for (auto& s : streams) s->cancel();
            throw;
        }
        const OutputParserOptions popts = output_parser_options(req, opts.chat_format);
        const bool with_reasoning = reports_reasoning(popts.start);
        const std::string id = random_id("chatcmpl-");
        inflight.add(id, streams);
        const int64_t created = unix_now();
        const std::string model = opts.served_model_name;
        if (!req.stream) {
            const bool want_lp = g.logprobs;
            respond_when_done(
                res, streams,
                [this, popts, with_reasoning, id, created, model, want_lp](std::vector<RequestDelta>& ds) {
                    json choices = json::array();
                    int64_t completion = 0;
                    for (size_t i = 0; i < ds.size(); ++i) {
                        const RequestDelta& d = ds[i];
                        if (d.finish == FinishReason::error) throw ApiError(500, d.error, "", "server_error");
                        OutputParser parser(popts);
                        AssistantMessage msg(with_reasoning);
                        msg.add(parser.push(d.text));
                        msg.add(parser.finish());
                        json c = {{"index", i},
                                  {"message", msg.to_openai_json()},
                                  {"logprobs", nullptr},
                                  {"finish_reason", msg.finish_reason(finish_name(d), parser.cut_in_block())}};
                        if (!d.matched_stop.empty()) c["matched_stop"] = d.matched_stop;
                        if (want_lp) {
                            json content = json::array();
                            for (auto& t : d.tokens) content.push_back(chat_logprob(t));
                            c["logprobs"] = json{{"content", content}};
                        }
                        choices.push_back(c);
                        completion += d.completion_tokens;
                    }
                    return dump(json{{"id", id},
                                     {"object", "chat.completion"},
                                     {"created", created},
                                     {"model", model},
                                     {"choices", choices},
                                     {"usage", usage_json(ds[0].prompt_tokens, completion, CachedTokens::of(ds[0]))}});
                });
            return;
        }
        res.content_type = "text/event-stream";
        const bool include_usage = req.include_usage, want_lp = g.logprobs;
        // Each choice's parser and message live as long as the stream.
        struct Choices {
            std::vector<std::unique_ptr<OutputParser>> parsers;
            std::vector<std::unique_ptr<AssistantMessage>> msgs;
        };
        auto choices = std::make_shared<Choices>();
        std::string head;
        for (size_t i = 0; i < streams.size(); ++i) {
            choices->parsers.push_back(std::make_unique<OutputParser>(popts));
            choices->msgs.push_back(std::make_unique<AssistantMessage>(with_reasoning));
            json role = {{"id", id},
                         {"object", "chat.completion.chunk"},
                         {"created", created},
                         {"model", model},
                         {"choices", json::array({json{{"index", i},
                                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                       {"logprobs", nullptr},
                                                       {"finish_reason", nullptr}}})}};
            head += "data: " + dump(role) + "\n\n";
        }
        res.stream = openai_events(
            streams, std::move(head),
            [this, choices, id, created, model, want_lp](size_t i, const RequestDelta& d) {
                auto& parsers = choices->parsers;
                auto& msgs = choices->msgs;
                auto events = parsers[i]->push(d.text);
                if (d.finished) {
                    auto rest = parsers[i]->finish();
                    events.insert(events.end(), rest.begin(), rest.end());
                }
                json delta = json::object();
                for (auto& e : events) {
                    msgs[i]->add(e);
                    json od = openai_delta(e);
                    if (od.is_null()) continue;
                    for (auto& [k, v] : od.items()) {
                        if (v.is_string() && delta.contains(k) && delta[k].is_string())
                            delta[k] = delta[k].get<std::string>() + v.get<std::string>();
                        else if (v.is_array() && delta.contains(k) && delta[k].is_array())
                            merge_tool_calls(delta[k], v);
                        else delta[k] = v;
                    }
                }
                json c = {{"index", i}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
                if (want_lp && !d.tokens.empty()) {
                    json content = json::array();
                    for (auto& t : d.tokens) content.push_back(chat_logprob(t));
                    c["logprobs"] = json{{"content", content}};
                }
                if (d.finished) c["finish_reason"] = msgs[i]->finish_reason(finish_name(d), parsers[i]->cut_in_block());
                return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                            {"choices", json::array({c})}};
            },
            [id, created, model, include_usage](const std::vector<RequestDelta>& totals) {
                if (!include_usage) return json();
                int64_t c = 0;
                for (auto& t : totals) c += t.completion_tokens;
                return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                            {"choices", json::array()},
                            {"usage", usage_json(totals[0].prompt_tokens, c, CachedTokens::of(totals[0]))}};
            });
    }

    // ---- /v1/messages (Anthropic) ------------------------------------------------------------------------

    struct PreparedMessages {
        ChatRequest req;
        ojson chat_body;
        std::vector<int32_t> prompt;
        GenerationParams params;
    };

    PreparedMessages prepare_messages(const HttpRequest& q, bool count_only) {
        MessagesRequest m = parse_messages_request(q.body, route_opts, count_only);
        PreparedMessages p{std::move(m.req), std::move(m.chat_body), encode_rendered(m.prompt), std::move(m.params)};
        return p;
    }

    void count_tokens(const HttpRequest& q, HttpResponse& res) {
        PreparedMessages p = prepare_messages(q, true);
        res.body = dump(json{{"input_tokens", p.prompt.size()}});
    }

    static json anthropic_usage(const RequestDelta& d) {
        return {{"input_tokens", d.prompt_tokens - d.cached_tokens},
                {"cache_creation_input_tokens", 0},
                {"cache_read_input_tokens", d.cached_tokens},
                {"output_tokens", d.completion_tokens}};
    }

    // stop_reason and stop_sequence of a finished request.
    static std::pair<std::string, json> anthropic_stop(const RequestDelta& d, const OutputParser& parser,
                                                       const AnthropicBlocks& blocks,
                                                       const std::vector<std::string>& stops) {
        if (blocks.has_tool_use() && !parser.cut_in_block()) return {"tool_use", nullptr};
        if (!d.matched_stop.empty() && std::find(stops.begin(), stops.end(), d.matched_stop) != stops.end())
            return {"stop_sequence", d.matched_stop};
        if (parser.stopped_by_sequence()) return {"stop_sequence", nullptr};
        if (d.finish == FinishReason::length) return {"max_tokens", nullptr};
        return {"end_turn", nullptr};
    }

    void messages(const HttpRequest& q, HttpResponse& res) {
        PreparedMessages p = prepare_messages(q, false);
        GenerationParams g = p.params;
        constrain(g, tool_choice_grammar(p.req, q));
        if (opts.scripted_output) g.processor = opts.scripted_output->next(tok);
        auto s = submit(p.prompt, g, "messages");
        const OutputParserOptions popts = output_parser_options(p.req, opts.chat_format);
        const std::vector<std::string> stops = p.req.stop;
        const std::string id = random_id("msg_");
        inflight.add(id, {s});
        const std::string model = opts.served_model_name;
        auto tool_ids = [](int) { return random_id("toolu_"); };
        if (!p.req.stream) {
            respond_when_done(res, {s}, [popts, stops, id, model, tool_ids](std::vector<RequestDelta>& ds) {
                const RequestDelta& d = ds[0];
                if (d.finish == FinishReason::error) throw ApiError(500, d.error, "", "server_error");
                OutputParser parser(popts, tool_ids);
                AnthropicBlocks blocks;
                for (auto& e : parser.push(d.text)) blocks.add(e, nullptr);
                for (auto& e : parser.finish()) blocks.add(e, nullptr);
                auto [reason, seq] = anthropic_stop(d, parser, blocks, stops);
                ojson m = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model},
                           {"content", blocks.content()}, {"stop_reason", reason}, {"stop_sequence", seq},
                           {"usage", anthropic_usage(d)}};
                return m.dump(-1, ' ', false, json::error_handler_t::replace);
            });
            return;
        }
        res.content_type = "text/event-stream";
        RequestDelta first;
        first.prompt_tokens = static_cast<int64_t>(p.prompt.size());
        ojson start = {{"type", "message_start"},
                       {"message",
                        {{"id", id},
                         {"type", "message"},
                         {"role", "assistant"},
                         {"model", model},
                         {"content", ojson::array()},
                         {"stop_reason", nullptr},
                         {"stop_sequence", nullptr},
                         {"usage", anthropic_usage(first)}}}};
        struct Message {
            OutputParser parser;
            AnthropicBlocks blocks;
        };
        auto m = std::make_shared<Message>(Message{OutputParser(popts, tool_ids), AnthropicBlocks()});
        auto on_delta = [m, stops](size_t, const RequestDelta& d) {
            std::string out;
            for (auto& e : m->parser.push(d.text)) m->blocks.add(e, &out);
            if (!d.finished) return out;
            if (d.finish == FinishReason::error) return out + sse_event("error", anthropic_error_json(500, d.error));
            for (auto& e : m->parser.finish()) m->blocks.add(e, &out);
            m->blocks.close(&out);
            auto [reason, seq] = anthropic_stop(d, m->parser, m->blocks, stops);
            out += sse_event("message_delta", {{"type", "message_delta"},
                                               {"delta", {{"stop_reason", reason}, {"stop_sequence", seq}}},
                                               {"usage", anthropic_usage(d)}});
            return out + sse_event("message_stop", {{"type", "message_stop"}});
        };
        res.stream = std::make_shared<EventStream>(
            std::vector<std::shared_ptr<RequestStream>>{s}, sse_event("message_start", start), std::move(on_delta),
            [](const std::vector<RequestDelta>&) { return std::string(); }, sse_event("ping", {{"type", "ping"}}));
    }

    // ---- /generate (SGLang native) -----------------------------------------------------------------------

    void generate(const HttpRequest& q, HttpResponse& res) {
        GenerateRequest gr = parse_generate_request(q.body, route_opts);
        std::vector<int32_t> ids = gr.prompt.is_text() ? encode_text(gr.prompt.text) : std::move(gr.prompt.ids);
        GenerationParams g = gr.params;
        constrain(g, compile_constraint(gr.constraint, gr.constraint_param, q));
        const bool stream = gr.stream;
        auto s = submit(ids, g, "input_ids");
        const std::string rid = gr.rid ? *gr.rid : random_id("");
        inflight.add(rid, {s});
        const auto t0 = std::chrono::steady_clock::now();
        auto result = [rid, t0, this](const RequestDelta& total, const std::string& text,
                                      const std::vector<int32_t>& out_ids, bool logprob) {
            json meta = {{"id", rid},
                         {"prompt_tokens", total.prompt_tokens},
                         {"completion_tokens", total.completion_tokens},
                         {"cached_tokens", total.cached_tokens},
                         {"cached_tokens_details", CachedTokens::of(total).details()},
                         {"e2e_latency", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
            meta["finish_reason"] = total.finished ? json{{"type", finish_name(total)}} : json(nullptr);
            if (total.finished && !total.matched_stop.empty()) meta["finish_reason"]["matched"] = total.matched_stop;
            if (logprob) {
                json lps = json::array();
                for (auto& t : total.tokens) lps.push_back(json::array({t.logprob, t.id, nullptr}));
                meta["output_token_logprobs"] = lps;
                json tops = json::array();
                for (auto& t : total.tokens) {
                    json row = json::array();
                    for (auto& x : t.top) row.push_back(json::array({x.logprob, x.id, nullptr}));
                    tops.push_back(row);
                }
                meta["output_top_logprobs"] = tops;
            }
            return json{{"text", text}, {"output_ids", out_ids}, {"meta_info", meta}};
        };
        if (!stream) {
            const bool logprob = g.logprobs;
            respond_when_done(res, {s}, [result, logprob](std::vector<RequestDelta>& ds) {
                const RequestDelta& d = ds[0];
                if (d.finish == FinishReason::error) throw ApiError(500, d.error, "", "server_error");
                std::vector<int32_t> out;
                for (auto& t : d.tokens) out.push_back(t.id);
                return dump(result(d, d.text, out, logprob));
            });
            return;
        }
        res.content_type = "text/event-stream";
        const bool logprob = g.logprobs;
        // Each event carries everything so far, as SGLang streams it.
        auto total = std::make_shared<RequestDelta>();
        auto out = std::make_shared<std::vector<int32_t>>();
        res.stream = openai_events(
            {s}, "",
            [result, logprob, total, out](size_t, const RequestDelta& d) {
                total->text += d.text;
                for (auto& t : d.tokens) {
                    out->push_back(t.id);
                    total->tokens.push_back(t);
                }
                total->prompt_tokens = d.prompt_tokens;
                total->cached_tokens = d.cached_tokens;
                total->cached_host = d.cached_host;
                total->cached_storage = d.cached_storage;
                total->completion_tokens = d.completion_tokens;
                total->finished = d.finished;
                total->finish = d.finish;
                total->matched_stop = d.matched_stop;
                return result(*total, total->text, *out, logprob);
            },
            [](const std::vector<RequestDelta>&) { return json(); });
    }
};

ApiServer::ApiServer(Engine& engine, const Tokenizer& tok, ApiOptions opts)
    : impl_(std::make_unique<Impl>(engine, tok, std::move(opts))) {}
ApiServer::~ApiServer() = default;
int ApiServer::bind(const std::string& host, int port) { return impl_->http.bind(host, port); }
void ApiServer::run() { impl_->http.run(); }
void ApiServer::stop() { impl_->http.stop(); }
int ApiServer::drain(std::chrono::milliseconds timeout) { return impl_->drain(timeout); }

}  // namespace peregrine
