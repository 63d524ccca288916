// The seccomp filter that hides kernel RDMA from `uroce run`; see netlink_filter.h.
#include "netlink_filter.h"

#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <fmt/format.h>
#include <cerrno>
#include <cstdint>
#include <system_error>

namespace uroce::tools {

namespace {

std::string errno_text(int err) {
    return std::error_code(err, std::generic_category()).message();
}

// Owns a libseccomp context.
class FilterContext {
  public:
    FilterContext() : ctx_(seccomp_init(SCMP_ACT_ALLOW)) {}
    ~FilterContext() {
        if (ctx_ != nullptr) seccomp_release(ctx_);
    }
    FilterContext(const FilterContext&) = delete;
    FilterContext& operator=(const FilterContext&) = delete;
    scmp_filter_ctx get() const { return ctx_; }

  private:
    scmp_filter_ctx ctx_;
};

}  // namespace

std::string refuse_rdma_netlink() {
    // Without it an unprivileged process may not load a filter; it also keeps
    // setuid programs started under the filter from gaining privileges.
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        return fmt::format("cannot set no_new_privs: {}", errno_text(errno));
    }
    FilterContext filter;
    if (filter.get() == nullptr) return "cannot create a seccomp filter (libseccomp)";
    // libseccomp's default for a foreign ABI is to kill the process.
    int rc = seccomp_attr_set(filter.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ALLOW);
    if (rc == 0) {
        // socket(2) takes ints: compare the low 32 bits only, as the kernel reads them.
        // (Plain structs: libseccomp's SCMP_A0() macros are C compound literals.)
        constexpr uint64_t kInt = 0xffffffffU;
        const scmp_arg_cmp netlink_rdma[] = {
            {0, SCMP_CMP_MASKED_EQ, kInt, static_cast<uint64_t>(AF_NETLINK)},
            {2, SCMP_CMP_MASKED_EQ, kInt, static_cast<uint64_t>(kNetlinkRdma)},
        };
        rc = seccomp_rule_add_array(filter.get(), SCMP_ACT_ERRNO(EPROTONOSUPPORT), SCMP_SYS(socket),
                                    2, netlink_rdma);
    }
    if (rc == 0) rc = seccomp_load(filter.get());
    if (rc != 0) return fmt::format("cannot load a seccomp filter: {}", errno_text(-rc));
    return {};
}

}  // namespace uroce::tools
