/* uaii_capi_embed.h — starting the embedded interpreter; included once, into the cffi-generated source of libuaii
 * (after cffi's _embedding.h, so Python.h and cffi_start_python() are in scope). Not a public header.
 *
 * cffi alone would call Py_InitializeEx() with the default configuration, whose sys.path is found from `python3`
 * on $PATH (possibly another installation's standard library) and does not contain the virtual environment that
 * holds cffi and the uaii packages; and when that fails, every call would return 0, i.e. UAII_OK. So every
 * Python-backed entry point first calls uaii__start_python(), which once per process:
 *
 *   1. if no interpreter runs yet, starts one as the virtual environment's own python would run: the venv is
 *      $VIRTUAL_ENV, else the nearest ancestor directory of libuaii.so with a pyvenv.cfg (a wheel installed in a
 *      venv), else an ancestor's `.venv/` (an editable install inside a project); without a venv, the Python home
 *      is the installation libpython was loaded from. $PYTHONHOME, when set, wins;
 *   2. runs cffi's own start (the embedded module and the init code, which registers the Python functions);
 *   3. on failure reports UAII_ERR_INTERNAL with the reason as last error, on this call and every later one.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t uaii_start_once = PTHREAD_ONCE_INIT;
static int uaii_start_rc = 0;
static char uaii_start_error[1024];

static int uaii_is_file(const char* dir, const char* name) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return 0;
    return access(path, R_OK) == 0;
}

/* dirname in place; returns 0 once at the root. */
static int uaii_parent(char* path) {
    char* slash = strrchr(path, '/');
    if (slash == NULL || slash == path) return 0;
    *slash = '\0';
    return 1;
}

/* The virtual environment to run in, or "" (see the rules above). */
static void uaii_find_venv(char* out, size_t cap) {
    const char* env = getenv("VIRTUAL_ENV");
    char dir[PATH_MAX], probe[PATH_MAX];
    out[0] = '\0';
    if (env != NULL && env[0] != '\0' && uaii_is_file(env, "pyvenv.cfg")) {
        snprintf(out, cap, "%s", env);
        return;
    }
    snprintf(dir, sizeof dir, "%s", uaii__library_path());
    for (int level = 0; level < 8 && uaii_parent(dir); level++) {
        if (uaii_is_file(dir, "pyvenv.cfg")) {
            snprintf(out, cap, "%s", dir);
            return;
        }
        if (snprintf(probe, sizeof probe, "%s/.venv", dir) < (int)sizeof probe && uaii_is_file(probe, "pyvenv.cfg")) {
            snprintf(out, cap, "%s", probe);
            return;
        }
    }
}

/* The prefix of the installation libpython was loaded from, when its standard library is there; else "". */
static void uaii_find_home(char* out, size_t cap) {
    Dl_info info;
    char dir[PATH_MAX], landmark[64];
    out[0] = '\0';
    if (dladdr((void*)&Py_InitializeFromConfig, &info) == 0 || info.dli_fname == NULL) return;
    if (realpath(info.dli_fname, dir) == NULL) return;
    if (!uaii_parent(dir) || !uaii_parent(dir)) return; /* <prefix>/lib/libpythonX.Y.so -> <prefix> */
    snprintf(landmark, sizeof landmark, "lib/python%d.%d/os.py", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    if (uaii_is_file(dir, landmark)) snprintf(out, cap, "%s", dir);
}

static int uaii_config_failed(PyStatus status, PyConfig* config) {
    snprintf(uaii_start_error, sizeof uaii_start_error, "Python initialization failed: %s%s%s",
             status.func ? status.func : "", status.func ? ": " : "", status.err_msg ? status.err_msg : "?");
    PyConfig_Clear(config);
    return -1;
}

static int uaii_initialize_python(void) {
    PyConfig config;
    PyStatus status;
    char venv[PATH_MAX], home[PATH_MAX], executable[PATH_MAX];
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* the host program owns its signals */
    config.parse_argv = 0;
    uaii_find_venv(venv, sizeof venv);
    if (venv[0] != '\0') {
        /* as `<venv>/bin/python` would start: pyvenv.cfg then gives base prefix and site-packages */
        snprintf(executable, sizeof executable, "%s/bin/python%d.%d", venv, PY_MAJOR_VERSION, PY_MINOR_VERSION);
        if (access(executable, X_OK) != 0) snprintf(executable, sizeof executable, "%s/bin/python", venv);
        status = PyConfig_SetBytesString(&config, &config.executable, executable);
        if (PyStatus_Exception(status)) return uaii_config_failed(status, &config);
        status = PyConfig_SetBytesString(&config, &config.program_name, executable);
        if (PyStatus_Exception(status)) return uaii_config_failed(status, &config);
    } else {
        const char* env_home = getenv("PYTHONHOME");
        uaii_find_home(home, sizeof home);
        if ((env_home == NULL || env_home[0] == '\0') && home[0] != '\0') {
            status = PyConfig_SetBytesString(&config, &config.home, home);
            if (PyStatus_Exception(status)) return uaii_config_failed(status, &config);
        }
    }
    status = Py_InitializeFromConfig(&config);
    if (PyStatus_Exception(status)) return uaii_config_failed(status, &config);
    PyConfig_Clear(&config);
    PyEval_SaveThread(); /* release the GIL: every call (from any thread) takes it through PyGILState */
    return 0;
}

static void uaii_start_python_once(void) {
    if (!Py_IsInitialized() && uaii_initialize_python() != 0) {
        uaii_start_rc = -1;
        return;
    }
#if PY_VERSION_HEX < 0x030C0000
    /* cffi's start-up spin lock (Python < 3.12) is PyCapsule_Type.tp_version_tag: it waits for the value 0. But the
       type attribute cache gives the type a tag as soon as any code looks up an attribute on a capsule (numpy and
       torch do), and cffi would then spin forever inside an interpreter that is already running. PyType_Modified()
       drops the tag; the cache assigns a new one at the next lookup. */
    {
        PyGILState_STATE gil = PyGILState_Ensure();
        PyType_Modified(&PyCapsule_Type);
        PyGILState_Release(gil);
    }
#endif
    if (cffi_start_python() != 0) {
        snprintf(uaii_start_error, sizeof uaii_start_error,
                 "the embedded module could not start (cffi's message is on stderr; is cffi installed where the "
                 "interpreter looks? set VIRTUAL_ENV to the environment that holds uaii-capi)");
        uaii_start_rc = -1;
    }
}

/* 0 when the Python side is ready; else -1 with the last error set for `function`. */
static int uaii__start_python(const char* function) {
    pthread_once(&uaii_start_once, uaii_start_python_once);
    if (uaii_start_rc != 0) {
        char msg[1280];
        snprintf(msg, sizeof msg, "[capi] %s: %s", function, uaii_start_error);
        uaii__set_error(msg);
    }
    return uaii_start_rc;
}
