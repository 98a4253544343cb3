#include "server/http_server.h"
#include "util/error.h"

#include <httplib.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace peregrine {

std::string HttpRequest::header(const std::string& name) const {
    for (auto& [k, v] : headers)
        if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
    return {};
}

struct HttpServer::Impl {
    HttpServerOptions opts;
    httplib::Server srv;
    std::map<std::string, std::string> allowed;  // path -> its methods ("GET, POST"), for 405s

    void send(const HttpResponse& out, httplib::Response& res) {
        res.status = out.status;
        if (out.stream) {
            auto producer = std::make_shared<std::function<void(const ChunkWriter&)>>(out.stream);
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
    }
    void refuse(int status, httplib::Response& res) {
        res.status = status;
        if (opts.error_body) res.set_content(opts.error_body(status), "application/json");
        res.set_header("Connection", "close");  // the unread body must not be taken for the next request
    }
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

// "address:port" of a socket's peer (peer) or own end.
std::string endpoint(int fd, bool peer) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if ((peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
              : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len)) != 0)
        return {};
    char host[INET6_ADDRSTRLEN] = {};
    int port = 0;
    if (ss.ss_family == AF_INET) {
        auto* a = reinterpret_cast<sockaddr_in*>(&ss);
        ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
        ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
    } else {
        return {};
    }
    return std::string(host) + ":" + std::to_string(port);
}

// Whether a request's client has closed its connection. cpp-httplib does not hand the socket to handlers, so the
// socket is found once by its two addresses among this process's descriptors; it stays open while the handler
// runs (the handler's thread owns the connection). Then a peek without reading tells: 0 bytes is the client's
// end of stream. A client that half-closes after its request counts as gone.
class ClientProbe {
public:
    ClientProbe(std::string peer, std::string local) : peer_(std::move(peer)), local_(std::move(local)) {}
    bool operator()() {
        if (fd_ == kUnknown) fd_ = find();
        if (fd_ < 0) return false;
        char c;
        ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }

private:
    static constexpr int kUnknown = -2;
    int find() const {
        DIR* dir = ::opendir("/proc/self/fd");
        if (!dir) return -1;
        int found = -1;
        while (dirent* e = ::readdir(dir)) {
            int fd = std::atoi(e->d_name);
            if (fd <= 2 || fd == ::dirfd(dir)) continue;
            if (endpoint(fd, true) == peer_ && endpoint(fd, false) == local_) {
                found = fd;
                break;
            }
        }
        ::closedir(dir);
        return found;
    }
    std::string peer_, local_;
    int fd_ = kUnknown;
};

}  // namespace

HttpServer::HttpServer(HttpServerOptions opts) : impl_(std::make_unique<Impl>()) {
    impl_->opts = std::move(opts);
    auto& srv = impl_->srv;
    const int threads = impl_->opts.threads;
    srv.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    srv.set_tcp_nodelay(true);                 // else every reused connection waits ~40 ms per chunk
    srv.set_keep_alive_max_count(1u << 20);    // the default closes a connection after 5 requests
    srv.set_keep_alive_timeout(5);             // an idle connection holds a thread; uvicorn's default
    srv.set_read_timeout(60, 0);
    srv.set_write_timeout(600, 0);
    srv.set_payload_max_length(impl_->opts.max_body_bytes);
    // A request with neither Content-Length nor Transfer-Encoding has no body (RFC 9112 6.3); cpp-httplib would read
    // one until the client closes (`curl -X POST .../flush_cache` hung for the read timeout). Say so explicitly.
    srv.set_pre_routing_handler([](const httplib::Request& req, httplib::Response&) {
        if (!req.has_header("Content-Length") && !req.has_header("Transfer-Encoding"))
            const_cast<httplib::Request&>(req).headers.emplace("Content-Length", "0");
        return httplib::Server::HandlerResponse::Unhandled;
    });
    auto body = impl_->opts.error_body;
    srv.set_error_handler([body](const httplib::Request&, httplib::Response& res) {
        if (res.body.empty() && body) res.set_content(body(res.status), "application/json");
    });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler h, HttpGate gate) {
    PEREGRINE_CHECK(method == "GET" || method == "POST", "unsupported method {}", method);
    std::string& allow = impl_->allowed[path];
    allow += (allow.empty() ? "" : ", ") + method;
    auto headers_of = [](const httplib::Request& req) {
        HttpRequest r;
        r.method = req.method;
        r.path = req.path;
        for (auto& [k, v] : req.headers) r.headers.emplace(k, v);
        return r;
    };
    Impl* impl = impl_.get();
    if (method == "GET") {
        impl_->srv.Get(path, [=](const httplib::Request& req, httplib::Response& res) {
            HttpRequest r = headers_of(req);
            HttpResponse out;
            if (!gate || gate(r, out)) h(r, out);
            impl->send(out, res);
        });
        return;
    }
    // POST: the gate sees the headers first, then the body is read here, counted as it arrives (after
    // decompression, whatever the framing), so no body beyond max_body_bytes is ever held.
    impl_->srv.Post(path, [=](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
        HttpRequest r = headers_of(req);
        r.client_gone = [probe = std::make_shared<ClientProbe>(
                             req.remote_addr + ":" + std::to_string(req.remote_port),
                             req.local_addr + ":" + std::to_string(req.local_port))] { return (*probe)(); };
        HttpResponse out;
        if (gate && !gate(r, out)) {
            impl->send(out, res);
            res.set_header("Connection", "close");
            return;
        }
        bool too_large = false;
        const size_t limit = impl->opts.max_body_bytes;
        const bool read_whole = read([&](const char* data, size_t n) {
            if (r.body.size() + n > limit) {
                too_large = true;
                return false;
            }
            r.body.append(data, n);
            return true;
        });
        // The transport refuses a declared Content-Length over the limit itself, before any byte.
        if (too_large || (!read_whole && req.get_header_value<uint64_t>("Content-Length") > limit))
            return impl->refuse(413, res);
        if (!read_whole) return impl->refuse(400, res);
        h(r, out);
        impl->send(out, res);
    });
}

int HttpServer::bind(const std::string& host, int port) {
    // Every other method of a routed path: 405 naming the allowed ones.
    for (const auto& [path, allow] : impl_->allowed) {
        auto not_allowed = [this, allow](const httplib::Request&, httplib::Response& res) {
            impl_->refuse(405, res);
            res.set_header("Allow", allow);
        };
        if (allow.find("GET") == std::string::npos) impl_->srv.Get(path, not_allowed);
        if (allow.find("POST") == std::string::npos) impl_->srv.Post(path, not_allowed);
        impl_->srv.Put(path, not_allowed);
        impl_->srv.Patch(path, not_allowed);
        impl_->srv.Delete(path, not_allowed);
    }
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
