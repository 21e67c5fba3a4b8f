// A minimal blocking HTTP/1.1 client over plain sockets, so tests control
// every byte: malformed requests, bodies cut short, disconnects mid-stream.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>

namespace aff::server::testing {

struct HttpReply {
  int status = 0;  // 0 = no parsable reply
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

class Conn {
 public:
  explicit Conn(int port, int timeout_s = 20) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{timeout_s, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) close();
  }
  ~Conn() { close(); }
  bool ok() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Next bytes from the socket ("" on EOF, error or timeout).
  std::string recv_some() {
    char buf[16384];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  std::string recv_all() {
    std::string all, s;
    while (!(s = recv_some()).empty()) all += s;
    return all;
  }

 private:
  int fd_ = -1;
};

inline std::string make_request(const std::string& method, const std::string& path, const std::string& body,
                                const std::string& content_type = "application/json") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST") {
    r += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return r + "\r\n" + body;
}

inline std::string dechunk(const std::string& raw) {
  std::string out;
  size_t p = 0;
  while (p < raw.size()) {
    size_t eol = raw.find("\r\n", p);
    if (eol == std::string::npos) break;
    size_t len = std::stoul(raw.substr(p, eol - p), nullptr, 16);
    if (len == 0) break;
    out += raw.substr(eol + 2, len);
    p = eol + 2 + len + 2;
  }
  return out;
}

inline HttpReply parse_reply(const std::string& raw) {
  HttpReply r;
  size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  size_t p = raw.find("\r\n") + 2;
  while (p < end) {
    size_t eol = raw.find("\r\n", p);
    std::string line = raw.substr(p, eol - p);
    size_t c = line.find(':');
    if (c != std::string::npos) {
      std::string k = line.substr(0, c);
      for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      size_t v = line.find_first_not_of(' ', c + 1);
      r.headers[k] = v == std::string::npos ? "" : line.substr(v);
    }
    p = eol + 2;
  }
  std::string body = raw.substr(end + 4);
  r.body = r.headers["transfer-encoding"] == "chunked" ? dechunk(body) : body;
  return r;
}

inline HttpReply http(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  Conn c(port);
  if (!c.ok() || !c.send_all(make_request(method, path, body))) return {};
  return parse_reply(c.recv_all());
}

}  // namespace aff::server::testing
