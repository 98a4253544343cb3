#include "server/http_server.h"
#include "util/error.h"

#include <utility>  // before Asio: its awaitable.hpp uses std::exchange without including it (Boost 1.74)

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <zlib.h>

#include <array>
#include <atomic>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

namespace peregrine {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string HttpRequest::header(const std::string& name) const {
    for (auto& [k, v] : headers)
        if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
    return {};
}

namespace {

// What every connection reads: the routes and limits, the pools.
struct ServerState {
    struct Route {
        HttpHandler handler;
        HttpGate gate;
    };
    struct Path {
        std::map<std::string, Route> methods;
        std::string allow;  // "GET, POST", for 405s
    };

    HttpServerOptions opts;
    std::map<std::string, Path> routes;
    std::unique_ptr<asio::thread_pool> workers;
    asio::io_context ioc;
    tcp::acceptor acceptor{ioc};
    asio::steady_timer accept_retry{ioc};
    std::atomic<int> connections{0};

};

enum class Inflated { ok, too_large, corrupt };

// Inflates a gzip or zlib ("deflate") body in place, refusing to grow past `limit` bytes.
Inflated inflate_body(std::string& body, size_t limit) {
    z_stream z{};
    if (inflateInit2(&z, 15 + 32) != Z_OK) return Inflated::corrupt;  // +32: either header, detected
    z.next_in = reinterpret_cast<Bytef*>(body.data());
    z.avail_in = static_cast<uInt>(body.size());
    std::string out;
    std::array<char, 64 << 10> chunk;
    Inflated result = Inflated::ok;
    for (int rc = Z_OK; rc != Z_STREAM_END;) {
        z.next_out = reinterpret_cast<Bytef*>(chunk.data());
        z.avail_out = static_cast<uInt>(chunk.size());
        rc = inflate(&z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END) {  // Z_BUF_ERROR here: the input ended inside the stream
            result = Inflated::corrupt;
            break;
        }
        const size_t n = chunk.size() - z.avail_out;
        if (out.size() + n > limit) {
            result = Inflated::too_large;
            break;
        }
        out.append(chunk.data(), n);
    }
    inflateEnd(&z);
    if (result == Inflated::ok) body = std::move(out);
    return result;
}

// One client connection. Every member is touched only on the connection's strand, except what the worker that runs
// its handler reads (the request it was given) and `wake_pending`.
class Connection : public std::enable_shared_from_this<Connection> {
public:
    Connection(ServerState& srv, tcp::socket sock)
        : srv_(srv), opts_(srv.opts), sock_(std::move(sock)), deadline_(sock_.get_executor()),
          poll_(sock_.get_executor()) {
        ++srv_.connections;
    }
    ~Connection() { --srv_.connections; }

    void start(bool over_capacity) {
        error_code ec;
        sock_.set_option(tcp::no_delay(true), ec);  // else a reused connection waits ~40 ms per small write
        if (over_capacity) return refuse(503);
        read_request();
    }

private:
    using Route = ServerState::Route;

    // ---- deadlines: a client that is too slow loses its connection ----
    void arm(std::chrono::steady_clock::duration d) {
        const uint64_t gen = ++deadline_gen_;
        deadline_.expires_after(d);
        deadline_.async_wait([self = shared_from_this(), gen](error_code ec) {
            if (!ec && gen == self->deadline_gen_) self->close();
        });
    }
    void disarm() {
        ++deadline_gen_;
        deadline_.cancel();
    }

    void close() {
        if (closed_) return;
        closed_ = true;
        if (stream_ && !stream_done_) stream_->abandon();
        stream_.reset();
        error_code ec;
        sock_.shutdown(tcp::socket::shutdown_both, ec);
        sock_.close(ec);
        deadline_.cancel();
        poll_.cancel();
    }

    // After a response that ends the connection: stop sending, then discard what the client still sends for a
    // moment before closing, so that it reads the answer instead of a reset.
    void linger_close() {
        if (closed_) return;
        error_code ec;
        sock_.shutdown(tcp::socket::shutdown_send, ec);
        arm(std::chrono::seconds(2));
        discard();
    }
    void discard() {
        sock_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](error_code ec, size_t) {
            if (ec) return self->close();
            self->discard();
        });
    }

    // ---- requests ----
    void read_request() {
        parser_.emplace();
        parser_->header_limit(static_cast<uint32_t>(opts_.max_header_bytes));
        // The real limit is set once the key was checked (a 401 goes before a 413). Not boost::none: 1.74 compares
        // a Content-Length against it as if it were 0.
        parser_->body_limit(std::numeric_limits<uint64_t>::max());
        arm(first_ ? opts_.header_timeout : opts_.idle_timeout);
        http::async_read_header(sock_, buf_, *parser_,
                                [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
    }

    void on_read_error(error_code ec) {
        if (closed_) return;
        if (ec == http::error::body_limit) return refuse(413);
        if (ec == http::error::header_limit) return refuse(431);
        if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
            ec.category() != http::make_error_code(http::error::bad_target).category())
            return close();  // the client left (or the socket failed): nobody to answer
        refuse(400);  // malformed HTTP
    }

    void on_header(error_code ec) {
        if (ec) return on_read_error(ec);
        auto& req = parser_->get();
        version_ = req.version();
        keep_alive_ = req.keep_alive();
        const std::string target(req.target());
        HttpRequest r;
        r.method = std::string(req.method_string());
        r.path = target.substr(0, target.find('?'));
        auto path = srv_.routes.find(r.path);
        if (path == srv_.routes.end()) return refuse(404);
        auto route = path->second.methods.find(r.method);
        if (route == path->second.methods.end()) return refuse(405, path->second.allow);
        for (const auto& f : req) r.headers.emplace(std::string(f.name_string()), std::string(f.value()));
        if (route->second.gate) {
            HttpResponse out;
            if (!route->second.gate(r, out)) {
                keep_alive_ = false;  // the unread body must not be taken for the next request
                return respond(std::move(out));
            }
        }
        if (parser_->is_done()) return dispatch(route->second, std::move(r));
        if (parser_->content_length() && *parser_->content_length() > opts_.max_body_bytes) return refuse(413);
        parser_->body_limit(opts_.max_body_bytes);  // counted as chunks arrive, whatever the framing
        const bool expects_continue = beast::iequals(req[http::field::expect], "100-continue");
        arm(opts_.body_timeout);
        auto read_body = [self = shared_from_this(), route = &route->second, r = std::move(r)]() mutable {
            http::async_read(self->sock_, self->buf_, *self->parser_,
                             [self, route, r = std::move(r)](error_code ec, size_t) mutable {
                                 if (ec) return self->on_read_error(ec);
                                 r.body = std::move(self->parser_->get().body());
                                 self->dispatch(*route, std::move(r));
                             });
        };
        if (!expects_continue) return read_body();
        static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        asio::async_write(sock_, asio::buffer(kContinue),
                          [self = shared_from_this(), read_body = std::move(read_body)](error_code ec, size_t) mutable {
                              if (ec) return self->close();
                              read_body();
                          });
    }

    // Runs the handler on a worker; the answer comes back to the connection's strand.
    void dispatch(const Route& route, HttpRequest r) {
        disarm();  // the client now waits for us
        first_ = false;
        const int fd = sock_.native_handle();
        // No operation runs on the socket while the handler does, so a peek cannot race the transport. A client
        // that half-closes after its request counts as gone.
        r.client_gone = [fd] {
            char c;
            ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
            return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        };
        asio::post(*srv_.workers, [self = shared_from_this(), &route, r = std::move(r)]() mutable {
            HttpResponse out;
            try {
                if (self->decode_body(r, out)) route.handler(r, out);
            } catch (const std::exception& e) {  // the API's handlers answer their own errors; this is a last resort
                spdlog::error("{} {}: {}", r.method, r.path, e.what());
                out = HttpResponse{};
                out.status = 500;
                out.body = self->error_body(500);
            }
            asio::post(self->sock_.get_executor(),
                       [self, out = std::move(out)]() mutable { self->respond(std::move(out)); });
        });
    }

    // Content-Encoding: gzip and deflate are inflated (counted against the body limit), others refused.
    bool decode_body(HttpRequest& r, HttpResponse& out) {
        const std::string enc = r.header("Content-Encoding");
        if (enc.empty() || beast::iequals(enc, "identity")) return true;
        int status = 415;
        if (beast::iequals(enc, "gzip") || beast::iequals(enc, "x-gzip") || beast::iequals(enc, "deflate")) {
            Inflated res = inflate_body(r.body, opts_.max_body_bytes);
            if (res == Inflated::ok) return true;
            status = res == Inflated::too_large ? 413 : 400;
        }
        out.status = status;
        out.body = error_body(status);
        return false;
    }

    std::string error_body(int status) const { return opts_.error_body ? opts_.error_body(status) : std::string(); }

    // ---- responses ----
    void refuse(int status, const std::string& allow = {}) {
        keep_alive_ = false;
        HttpResponse out;
        out.status = status;
        out.body = error_body(status);
        respond(std::move(out), allow);
    }

    void respond(HttpResponse out, const std::string& allow = {}) {
        if (closed_) {
            if (out.stream) out.stream->abandon();
            return;
        }
        if (out.stream) return start_stream(std::move(out));
        auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(out.status),
                                                                       version_);
        res->set(http::field::content_type, out.content_type);
        if (!allow.empty()) res->set(http::field::allow, allow);
        res->keep_alive(keep_alive_);
        res->body() = std::move(out.body);
        res->prepare_payload();
        arm(opts_.write_timeout);
        http::async_write(sock_, *res, [self = shared_from_this(), res](error_code ec, size_t) {
            self->disarm();
            if (ec) return self->close();
            self->next_request();
        });
    }

    void next_request() {
        if (closed_) return;
        if (keep_alive_) return read_request();
        linger_close();
    }

    // A streamed body: chunked on HTTP/1.1 (else the end of the connection ends it). While it runs, a read on the
    // socket notices at once when the client leaves.
    void start_stream(HttpResponse out) {
        stream_ = std::move(out.stream);
        stream_done_ = false;
        chunked_ = version_ >= 11;
        if (!chunked_) keep_alive_ = false;
        auto head = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(out.status),
                                                                       version_);
        head->set(http::field::content_type, out.content_type);
        head->set(http::field::cache_control, "no-cache");
        head->keep_alive(keep_alive_);
        if (chunked_) head->chunked(true);
        auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*head);
        arm(opts_.write_timeout);
        http::async_write_header(sock_, *sr, [self = shared_from_this(), head, sr](error_code ec, size_t) {
            self->disarm();
            if (ec) return self->close();
            self->watch_client();
            self->stream_->start(self->waker());
            self->pump();
        });
    }

    std::function<void()> waker() {
        return [weak = std::weak_ptr<Connection>(shared_from_this())] {
            auto self = weak.lock();
            if (!self || self->wake_pending_.exchange(true)) return;
            asio::post(self->sock_.get_executor(), [self] {
                self->wake_pending_ = false;
                if (!self->waiting_ || self->closed_) return;
                self->waiting_ = false;
                self->poll_.cancel();
                self->pump();
            });
        };
    }

    // Pulls what the body has ready and writes it; with nothing ready, waits for a wake or the poll interval.
    void pump() {
        if (closed_ || !stream_) return;
        std::string data;
        bool more = false;
        try {
            more = stream_->pull(data);
        } catch (const std::exception& e) {
            spdlog::error("streamed response: {}", e.what());
            return close();
        }
        if (data.empty() && more) {
            waiting_ = true;
            poll_.expires_after(BodyStream::kPollInterval);
            poll_.async_wait([self = shared_from_this()](error_code ec) {
                if (ec || !self->waiting_ || self->closed_) return;
                self->waiting_ = false;
                self->pump();
            });
            return;
        }
        if (!more) stream_done_ = true;
        out_.clear();
        if (chunked_ && !data.empty()) out_ = fmt::format("{:x}\r\n{}\r\n", data.size(), data);
        else if (!chunked_) out_ = std::move(data);
        if (chunked_ && !more) out_ += "0\r\n\r\n";
        arm(opts_.write_timeout);
        asio::async_write(sock_, asio::buffer(out_), [self = shared_from_this(), more](error_code ec, size_t) {
            self->disarm();
            if (ec) return self->close();
            if (more) return self->pump();
            self->stream_.reset();
            if (self->keep_alive_ && self->watching_) {
                self->resume_after_watch_ = true;  // the watch's completion goes on to the next request
                error_code ignored;
                self->sock_.cancel(ignored);
                return;
            }
            self->next_request();
        });
    }

    void watch_client() {
        watching_ = true;
        sock_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
            self->watching_ = false;
            if (!ec) self->buf_.commit(n);  // a pipelined next request: kept for after this response
            if (self->resume_after_watch_) {
                self->resume_after_watch_ = false;
                if (!ec || ec == asio::error::operation_aborted) return self->next_request();
                return self->close();
            }
            if (ec && ec != asio::error::operation_aborted) self->close();  // the client left: the stream is abandoned
        });
    }

    ServerState& srv_;
    const HttpServerOptions& opts_;
    tcp::socket sock_;
    asio::steady_timer deadline_, poll_;
    uint64_t deadline_gen_ = 0;
    beast::flat_buffer buf_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::array<char, 4096> scratch_;
    unsigned version_ = 11;
    bool first_ = true, keep_alive_ = false, closed_ = false;
    // The streamed body in progress.
    std::shared_ptr<BodyStream> stream_;
    std::string out_;
    bool stream_done_ = false, chunked_ = true, waiting_ = false, watching_ = false, resume_after_watch_ = false;
    std::atomic<bool> wake_pending_{false};
};

// Thousands of connections need as many descriptors: take the hard limit, as servers commonly do.
void raise_open_file_limit(int wanted) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < static_cast<rlim_t>(wanted) + 64)
        spdlog::warn("open files are limited to {}: fewer than the {} connections allowed", rl.rlim_cur, wanted);
}

}  // namespace

struct HttpServer::Impl : ServerState {
    void accept();
    ~Impl() {
        // Handlers still running post their answers into the io_context: they finish before it goes.
        workers->stop();
        workers->join();
    }
};

void HttpServer::Impl::accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](error_code ec, tcp::socket sock) {
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
        if (ec) {  // out of descriptors, most likely: try again shortly rather than spin
            spdlog::warn("accept: {}", ec.message());
            accept_retry.expires_after(std::chrono::milliseconds(100));
            accept_retry.async_wait([this](error_code e) {
                if (!e) accept();
            });
            return;
        }
        const bool over = connections.load() >= opts.max_connections;
        std::make_shared<Connection>(*this, std::move(sock))->start(over);
        accept();
    });
}

HttpServer::HttpServer(HttpServerOptions opts) : impl_(std::make_unique<Impl>()) {
    impl_->opts = std::move(opts);
    impl_->workers = std::make_unique<asio::thread_pool>(static_cast<size_t>(std::max(1, impl_->opts.worker_threads)));
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler h, HttpGate gate) {
    PEREGRINE_CHECK(method == "GET" || method == "POST", "unsupported method {}", method);
    auto& p = impl_->routes[path];
    p.methods[method] = {std::move(h), std::move(gate)};
    p.allow += (p.allow.empty() ? "" : ", ") + method;
}

int HttpServer::bind(const std::string& host, int port) {
    error_code ec;
    tcp::resolver resolver(impl_->ioc);
    auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    if (ec || found.empty()) fail("cannot listen on {}:{}: {}", host, port, ec ? ec.message() : "no address");
    const tcp::endpoint ep = found.begin()->endpoint();
    auto& a = impl_->acceptor;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(4096, ec);
    if (ec) fail("cannot listen on {}:{}: {}", host, port, ec.message());
    raise_open_file_limit(impl_->opts.max_connections);
    return a.local_endpoint().port();
}

void HttpServer::run() {
    impl_->accept();
    std::vector<std::thread> extra;
    for (int i = 1; i < impl_->opts.io_threads; ++i) extra.emplace_back([this] { impl_->ioc.run(); });
    impl_->ioc.run();
    for (auto& t : extra) t.join();
}

void HttpServer::stop() {
    asio::post(impl_->ioc, [impl = impl_.get()] {
        error_code ec;
        impl->acceptor.close(ec);
    });
    impl_->ioc.stop();
}

int HttpServer::open_connections() const { return impl_->connections.load(); }

}  // namespace peregrine
