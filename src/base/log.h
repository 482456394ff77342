/* Leveled logging to stderr and, once log_open_file was called, to a file as well (with
 * the date). The level and the file are process-wide because a log line may come from
 * any layer; both are set once by main, before threads start. */
#ifndef CAIRN_BASE_LOG_H
#define CAIRN_BASE_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Appends every later line to path too (created 0644, folders not made). 0, or -1 with
 * errno when it cannot be opened. */
int log_open_file(const char *path);
/* Flushes and closes the file. */
void log_close_file(void);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
