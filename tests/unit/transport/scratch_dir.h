// A directory of a test's own for its files.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace uroce::transport::test {

// /tmp/PREFIX-PID-N, made afresh (one left by an earlier run whose process had the same pid
// would hold its files) and removed when the test process ends. A child of fork() must leave
// by _exit, or it would remove them too.
inline std::filesystem::path scratch_dir(const std::string& prefix) {
    struct Dirs {
        std::vector<std::filesystem::path> made;
        ~Dirs() {
            std::error_code ec;
            for (const auto& d : made) std::filesystem::remove_all(d, ec);
        }
    };
    static Dirs dirs;
    auto dir =
        std::filesystem::temp_directory_path() /
        (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(dirs.made.size() + 1));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    dirs.made.push_back(dir);
    return dir;
}

}  // namespace uroce::transport::test
