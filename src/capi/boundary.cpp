#include "capi/boundary.hpp"

#include <new>

namespace rtattn::capi {

LastError& last_error() {
    thread_local LastError e;
    return e;
}

rtattn_status fail(rtattn_status status, const std::string& field, const std::string& message) {
    LastError& e = last_error();
    e = LastError{};
    e.status = status;
    e.field = field;
    e.message = field.empty() ? message : field + ": " + message;
    return status;
}

rtattn_status record_current_exception() {
    LastError& e = last_error();
    e = LastError{};
    try {
        throw;
    } catch (const core::ConfigError& x) {
        e.status = RTATTN_ERROR_CONFIG;
        e.field = x.field();
        e.message = x.what();
    } catch (const core::ArgumentError& x) {
        e.status = RTATTN_ERROR_ARGUMENT;
        e.field = x.field();
        e.message = x.what();
    } catch (const core::CompileError& x) {
        e.status = RTATTN_ERROR_COMPILE;
        e.message = x.what();
        e.log = x.log();
        e.options = x.options();
        e.source = x.source();
    } catch (const core::CudaError& x) {
        e.status = RTATTN_ERROR_CUDA;
        e.message = x.what();
        e.cuda_call = x.call();
        e.cuda_result = x.result();
    } catch (const core::CacheMissError& x) {
        e.status = RTATTN_ERROR_CACHE_MISS;
        e.message = x.what();
    } catch (const core::CacheError& x) {
        e.status = RTATTN_ERROR_CACHE;
        e.message = x.what();
    } catch (const std::bad_alloc&) {
        e.status = RTATTN_ERROR_OUT_OF_MEMORY;
        e.message = "out of host memory";
    } catch (const std::exception& x) {
        e.status = RTATTN_ERROR_INTERNAL;
        e.message = std::string("internal error: ") + x.what();
    } catch (...) {
        e.status = RTATTN_ERROR_INTERNAL;
        e.message = "internal error: an unknown exception";
    }
    return e.status;
}

}  // namespace rtattn::capi
