// Where verbs_qp::comp_mask goes for the libibverbs release that loaded the provider
// (provider/qp_ex_layout.cpp), checked against this machine's real libibverbs: its
// ibv_qp_to_qp_ex() must find the ibv_wr_* API of a QP the provider marked.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "provider/qp_ex_layout.h"

using uroce::provider::comp_mask_offset_for;
using uroce::provider::loaded_comp_mask_offset;
using uroce::provider::set_qp_comp_mask;

namespace {

constexpr size_t kBuilt = offsetof(verbs_qp, comp_mask);

// The file this process mapped for libibverbs, from /proc/self/maps.
std::string mapped_libibverbs() {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        const size_t at = line.find('/');
        if (at != std::string::npos && line.find("/libibverbs.so", at) != std::string::npos)
            return line.substr(at);
    }
    return {};
}

}  // namespace

TEST_CASE("comp_mask offset: from the release in libibverbs' file name", "[qp_ex_layout]") {
    CHECK(kBuilt == 360);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.44.0") == 352);
    CHECK(comp_mask_offset_for("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0") == 352);
    CHECK(comp_mask_offset_for("/usr/lib/libibverbs.so.1.14.50.0") == 360);  // Ubuntu 24.04
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.45.0") == 360);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.56.0") == 360);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.39.0") == 344);  // Ubuntu 22.04
    CHECK(comp_mask_offset_for("libibverbs.so.1.11.36.0") == 344);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.43.0") == 344);
    // Names that say nothing, or a release outside ABI 34: the built layout.
    CHECK(comp_mask_offset_for("libibverbs.so.1") == kBuilt);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14") == kBuilt);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.35.0") == kBuilt);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.57.0") == kBuilt);
    CHECK(comp_mask_offset_for("libibverbs.so.1.14.99999.0") == kBuilt);
    CHECK(comp_mask_offset_for("libmlx5.so.1.24.44.0") == kBuilt);
    CHECK(comp_mask_offset_for("") == kBuilt);
}

TEST_CASE("comp_mask offset: this process's libibverbs, and its ibv_qp_to_qp_ex",
          "[qp_ex_layout]") {
    const std::string path = mapped_libibverbs();
    INFO("libibverbs mapped from: " << path);
    REQUIRE_FALSE(path.empty());
    CHECK(loaded_comp_mask_offset() == comp_mask_offset_for(path));

    verbs_qp vqp;
    std::memset(&vqp, 0, sizeof vqp);
    CHECK(ibv_qp_to_qp_ex(&vqp.qp) == nullptr);  // no mark: no ibv_wr_* API
    set_qp_comp_mask(vqp, VERBS_QP_EX);
    CHECK(vqp.comp_mask == VERBS_QP_EX);
    // The real library reads its own offset and finds the mark.
    CHECK(ibv_qp_to_qp_ex(&vqp.qp) == &vqp.qp_ex);
    uint32_t at_loaded = 0;
    std::memcpy(&at_loaded,
                reinterpret_cast<const unsigned char*>(&vqp) + loaded_comp_mask_offset(),
                sizeof at_loaded);
    CHECK(at_loaded == VERBS_QP_EX);
}
