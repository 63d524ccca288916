// See counter_file.h.
#include "transport/counter_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace uroce::transport {

bool CounterFileView::open(const std::string& path, size_t bytes, const char* kind,
                           std::string& error) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        error = errno_text("cannot open " + path, errno);
        return false;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
        ::close(fd);
        error = path + " is not a " + kind + " file";
        return false;
    }
    void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    const int map_err = errno;
    ::close(fd);
    if (map == MAP_FAILED) {
        error = errno_text("cannot map " + path, map_err);
        return false;
    }
    map_ = map;
    length_ = bytes;
    return true;
}

CounterFileView::~CounterFileView() {
    if (map_) ::munmap(map_, length_);
}

}  // namespace uroce::transport
