#pragma once
// OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the HTTP status to send.
#include "util/error.h"

#include <nlohmann/json.hpp>
#include <string>

namespace peregrine {

class ApiError : public Error {
public:
    ApiError(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error",
             std::string code = {})
        : Error(message), status_(status), param_(std::move(param)), type_(std::move(type)), code_(std::move(code)) {}
    int status() const { return status_; }
    nlohmann::json to_json() const;

private:
    int status_;
    std::string param_, type_, code_;
};

nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code);

}  // namespace peregrine
