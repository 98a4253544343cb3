#pragma once
// The HTTP transport behind the API handlers: event-driven (Boost.Beast over Asio, inside http_server.cpp), so a
// connection holds no thread while it is idle, sends its request slowly or receives a stream. Handlers run on a
// bounded pool of worker threads; streamed bodies are pulled from them without blocking.
#include <chrono>
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

// A body produced over time (SSE events, or an answer that takes long). The transport pulls it on its own threads,
// so no call may block.
class BodyStream {
public:
    virtual ~BodyStream() = default;
    // Called once before the first pull. `wake` asks for a pull soon; any thread may call it, also after the
    // connection is gone. Without a wake the transport pulls every `kPollInterval` anyway.
    virtual void start(std::function<void()> wake) = 0;
    // Appends what is ready to `out`; returns false once the body is complete (`out` then holds its last bytes).
    virtual bool pull(std::string& out) = 0;
    // The client left (or stopped reading) before the body was complete.
    virtual void abandon() = 0;
    static constexpr std::chrono::milliseconds kPollInterval{250};
};

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::shared_ptr<BodyStream> stream;  // set: the body is streamed (chunked), `body` ignored
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;
// Runs on a request's headers before its body is read (the body is empty then); false: `response` is the answer and
// the body is never read (an unauthenticated client cannot make the server buffer megabytes).
using HttpGate = std::function<bool(const HttpRequest& headers, HttpResponse& response)>;

struct HttpServerOptions {
    int worker_threads = 64;      // handlers running at once (a non-streamed answer holds one up to a second)
    int io_threads = 2;           // threads that move bytes for every connection
    int max_connections = 4096;   // open connections beyond this are answered 503 and closed
    size_t max_body_bytes = 32u << 20;     // larger bodies get 413, counted as they arrive (inflated)
    size_t max_header_bytes = 64u << 10;   // larger request headers get 431
    // A slow or silent client loses its connection after these.
    std::chrono::seconds header_timeout{10};  // from connect to the end of a request's headers
    std::chrono::seconds idle_timeout{5};     // between requests on a kept-alive connection (uvicorn's default)
    std::chrono::seconds body_timeout{60};    // to receive a whole body
    std::chrono::seconds write_timeout{60};   // for each write to be taken by the client
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
    int open_connections() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace peregrine
