#include "server/http_server.h"
#include "util/error.h"

#include <httplib.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

namespace peregrine {

std::string HttpRequest::header(const std::string& name) const {
    for (auto& [k, v] : headers)
        if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
    return {};
}

struct HttpServer::Impl {
    HttpServerOptions opts;
    httplib::Server srv;
};

namespace {

// cpp-httplib listens with a backlog of 5, so bursts of connections overflow and wait for SYN
// retransmits (seconds). Linux takes a new backlog from a second listen() on the bound socket.
void raise_listen_backlog(int port) {
    for (int fd = 3; fd < 4096; ++fd) {
        int acc = 0;
        socklen_t len = sizeof(acc);
        if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) != 0 || !acc) continue;
        sockaddr_storage ss{};
        socklen_t sl = sizeof(ss);
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0) continue;
        int p = ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                                        : ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
        if (p == port) ::listen(fd, 4096);
    }
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions opts) : impl_(std::make_unique<Impl>()) {
    impl_->opts = std::move(opts);
    auto& srv = impl_->srv;
    const int threads = impl_->opts.threads;
    srv.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    srv.set_tcp_nodelay(true);                 // else every reused connection waits ~40 ms per chunk
    srv.set_keep_alive_max_count(1u << 20);    // the default closes a connection after 5 requests
    srv.set_keep_alive_timeout(60);
    srv.set_read_timeout(600, 0);
    srv.set_write_timeout(600, 0);
    srv.set_payload_max_length(impl_->opts.max_body_bytes);
    auto body = impl_->opts.error_body;
    srv.set_error_handler([body](const httplib::Request&, httplib::Response& res) {
        if (res.body.empty() && body) res.set_content(body(res.status), "application/json");
    });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler h) {
    auto wrap = [h](const httplib::Request& req, httplib::Response& res) {
        HttpRequest r;
        r.method = req.method;
        r.path = req.path;
        r.body = req.body;
        for (auto& [k, v] : req.headers) r.headers.emplace(k, v);
        HttpResponse out;
        h(r, out);
        res.status = out.status;
        if (out.stream) {
            auto producer = std::make_shared<std::function<void(const ChunkWriter&)>>(std::move(out.stream));
            res.set_chunked_content_provider(out.content_type, [producer](size_t, httplib::DataSink& sink) {
                (*producer)([&sink](const std::string& chunk) {
                    if (sink.is_writable && !sink.is_writable()) return false;
                    return sink.write(chunk.data(), chunk.size());
                });
                sink.done();
                return true;
            });
        } else {
            res.set_content(out.body, out.content_type);
        }
    };
    if (method == "GET") impl_->srv.Get(path, wrap);
    else if (method == "POST") impl_->srv.Post(path, wrap);
    else fail("unsupported method {}", method);
}

int HttpServer::bind(const std::string& host, int port) {
    int bound = port;
    if (port == 0) bound = impl_->srv.bind_to_any_port(host);
    else if (!impl_->srv.bind_to_port(host, port)) bound = -1;
    if (bound <= 0) fail("cannot listen on {}:{}", host, port);
    raise_listen_backlog(bound);
    return bound;
}

void HttpServer::run() { impl_->srv.listen_after_bind(); }

void HttpServer::stop() {
    if (impl_->srv.is_running()) impl_->srv.stop();
}

}  // namespace peregrine
