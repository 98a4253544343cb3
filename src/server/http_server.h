#pragma once
// The HTTP transport behind the API handlers. cpp-httplib stays inside http_server.cpp (pimpl), so the
// handlers never see it and another transport can replace it.
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace peregrine {

struct HttpRequest {
    std::string method, path, body;
    std::multimap<std::string, std::string> headers;  // as received
    std::string header(const std::string& name) const;
    // True once the client has closed its connection (a handler polls it during long work before answering);
    // null where the transport cannot tell.
    std::function<bool()> client_gone;
};

// A streamed body: the producer calls write() per chunk; write returns false once the client is gone.
using ChunkWriter = std::function<bool(const std::string& chunk)>;

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::function<void(const ChunkWriter& write)> stream;  // set: chunked body (SSE), body ignored
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;
// Runs on a request's headers before its body is read (the body is empty then); false: `response` is the answer and
// the body is never read (an unauthenticated client cannot make the server buffer megabytes).
using HttpGate = std::function<bool(const HttpRequest& headers, HttpResponse& response)>;

struct HttpServerOptions {
    int threads = 512;                          // one per in-flight connection (streams block a thread)
    size_t max_body_bytes = 32u << 20;          // larger bodies get 413, counted as they arrive (inflated)
    // Body for errors the transport produces itself (404, 413, ...): status -> JSON text.
    std::function<std::string(int status)> error_body;
};

class HttpServer {
public:
    explicit HttpServer(HttpServerOptions opts = {});
    ~HttpServer();

    // A method on a path (GET or POST). The other methods of a routed path are answered 405 with Allow.
    void route(const std::string& method, const std::string& path, HttpHandler h, HttpGate gate = {});
    // Binds host:port (port 0: any free port); returns the bound port. Throws when it cannot bind.
    int bind(const std::string& host, int port);
    // Serves until stop().
    void run();
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace peregrine
