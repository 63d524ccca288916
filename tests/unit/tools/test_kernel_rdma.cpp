// tools/kernel_rdma.cpp: which hosts `uroce add/list/env` warn about, checked
// against fake roots (a /sys/module entry, modules.dep and modules.builtin files).
#define CATCH_CONFIG_MAIN
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/kernel_rdma.h"

namespace fs = std::filesystem;
using uroce::tools::kernel_rdma_advice;
using uroce::tools::KernelRdma;
using uroce::tools::probe_kernel_rdma;

namespace {

constexpr const char* kRelease = "6.1.0-18-amd64";

// A fresh directory, removed when the test ends.
class FakeRoot {
  public:
    FakeRoot() {
        std::string tmpl = (fs::temp_directory_path() / "uroce-kernel-rdma.XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) FAIL("mkdtemp failed");
        path_ = tmpl;
    }
    ~FakeRoot() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    FakeRoot(const FakeRoot&) = delete;
    FakeRoot& operator=(const FakeRoot&) = delete;

    const fs::path& path() const { return path_; }

    void write(const fs::path& relative, const std::string& text) const {
        fs::create_directories((path_ / relative).parent_path());
        std::ofstream(path_ / relative) << text;
    }

  private:
    fs::path path_;
};

const std::string kModules = std::string("lib/modules/") + kRelease + "/";

}  // namespace

TEST_CASE("a bare root has no kernel RDMA") {
    FakeRoot root;
    CHECK(probe_kernel_rdma(root.path(), kRelease) == KernelRdma::None);
    CHECK(kernel_rdma_advice(KernelRdma::None).empty());
}

TEST_CASE("sys/module/ib_core means loaded") {
    FakeRoot root;
    fs::create_directories(root.path() / "sys/module/ib_core");
    CHECK(probe_kernel_rdma(root.path(), kRelease) == KernelRdma::Loaded);
}

TEST_CASE("modules.dep listing ib_core means loadable, compressed or not") {
    for (const char* file : {"ib_core.ko", "ib_core.ko.xz", "ib_core.ko.zst"}) {
        FakeRoot root;
        root.write(kModules + "modules.dep",
                   "kernel/net/core/foo.ko:\n"
                   "kernel/drivers/infiniband/core/" +
                       std::string(file) + ": kernel/net/ipv6/ipv6.ko\n");
        CHECK(probe_kernel_rdma(root.path(), kRelease) == KernelRdma::Loadable);
    }
}

TEST_CASE("a usr/lib/modules tree counts too") {
    FakeRoot root;
    root.write(std::string("usr/lib/modules/") + kRelease + "/modules.dep",
               "kernel/drivers/infiniband/core/ib_core.ko:\n");
    CHECK(probe_kernel_rdma(root.path(), kRelease) == KernelRdma::Loadable);
}

TEST_CASE("modules.builtin listing ib_core means built in") {
    FakeRoot root;
    root.write(kModules + "modules.builtin", "kernel/drivers/infiniband/core/ib_core.ko\n");
    root.write(kModules + "modules.dep", "");
    CHECK(probe_kernel_rdma(root.path(), kRelease) == KernelRdma::BuiltIn);
}

TEST_CASE("other modules and other releases do not count") {
    FakeRoot root;
    // Modules whose names contain ib_core, and ib_core only as a dependency.
    root.write(kModules + "modules.dep",
               "kernel/drivers/infiniband/core/ib_core_uverbs.ko: "
               "kernel/drivers/infiniband/core/ib_core.ko\n"
               "kernel/drivers/infiniband/hw/mlx5/mlx5_ib_core.ko:\n"
               "kernel/drivers/infiniband/core/ib_core.kox:\n"
               "kernel/drivers/infiniband/core/ib_core.o:\n");
    root.write("lib/modules/5.10.0-other/modules.dep",
               "kernel/drivers/infiniband/core/ib_core.ko:\n");
    CHECK(probe_kernel_rdma(root.path(), kRelease) == KernelRdma::None);
    // A release that would climb out of lib/modules is not looked up.
    CHECK(probe_kernel_rdma(root.path(), "../modules/5.10.0-other") == KernelRdma::None);
}

TEST_CASE("the advice names the state and both remedies") {
    for (auto state : {KernelRdma::Loaded, KernelRdma::BuiltIn, KernelRdma::Loadable}) {
        const std::string advice = kernel_rdma_advice(state);
        CHECK(advice.find("ib_core") != std::string::npos);
        CHECK(advice.find("'uroce run'") != std::string::npos);
        CHECK(advice.find("LD_PRELOAD") != std::string::npos);
        CHECK(advice.find('\n') == std::string::npos);
    }
    CHECK(kernel_rdma_advice(KernelRdma::Loadable).find("can be loaded") != std::string::npos);
}
