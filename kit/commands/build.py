from kit.commands._stub import not_implemented

command = not_implemented("build", "Build kit's images from containers/ (GPU or CPU engine).")
