# Packaging: one runtime package, .deb and .rpm (scripts/package builds both).
set(CPACK_PACKAGE_NAME "dltrain")
set(CPACK_PACKAGE_VENDOR "dltrain")
set(CPACK_PACKAGE_CONTACT "dltrain maintainers <maintainers@dltrain.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Distributed training of image-recognition models: agent daemon, PS and worker tasks, client")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_COMPONENTS_ALL runtime)
set(CPACK_DEB_COMPONENT_INSTALL OFF)
set(CPACK_RPM_COMPONENT_INSTALL OFF)

set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, dataset-fashion-mnist, libopenblas0-openmp")
# The Python client (python3's module dltrain) imports these; the daemons need none of them.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, python3-websocket, python3-tomli-w")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, python3-tqdm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${CMAKE_SOURCE_DIR}/packaging/postinst;${CMAKE_SOURCE_DIR}/packaging/prerm;${CMAKE_SOURCE_DIR}/packaging/postrm;${CMAKE_SOURCE_DIR}/packaging/conffiles")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(CPACK_RPM_PACKAGE_LICENSE "Proprietary")
set(CPACK_RPM_PACKAGE_GROUP "Applications/Engineering")
set(CPACK_RPM_PACKAGE_AUTOREQ OFF)
set(CPACK_RPM_PACKAGE_RELOCATABLE OFF)
# Runtime dependencies by their Fedora names.
set(CPACK_RPM_PACKAGE_REQUIRES "pytorch >= 1.13, rocksdb, spdlog, fmt, tomlplusplus, prometheus-cpp, openssl-libs, zlib, systemd-libs, turbojpeg, libpng, gperftools-libs, openblas-openmp, shadow-utils")
# The .deb's maintainer scripts serve as %post, %preun and %postun: they tell dpkg's
# arguments from rpm's (a package count) and pick whichever user tools the system has.
set(CPACK_RPM_PACKAGE_REQUIRES_POST "shadow-utils, coreutils")
set(CPACK_RPM_POST_INSTALL_SCRIPT_FILE "${CMAKE_SOURCE_DIR}/packaging/postinst")
set(CPACK_RPM_PRE_UNINSTALL_SCRIPT_FILE "${CMAKE_SOURCE_DIR}/packaging/prerm")
set(CPACK_RPM_POST_UNINSTALL_SCRIPT_FILE "${CMAKE_SOURCE_DIR}/packaging/postrm")
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION "/etc;/lib;/lib/systemd;/lib/systemd/system;/usr/lib/systemd;/usr/lib/systemd/system")
set(CPACK_RPM_USER_FILELIST "%config(noreplace) /etc/dltrain/agent.toml")

include(CPack)
