/* json — a JSON document (config.json, a safetensors header, model.safetensors.index.json) read the
 * way Python's json module reads it (transformers, safetensors), or refused: cJSON stops at the end
 * of the value and ignores what follows, and of a key given twice it finds the first where Python
 * keeps the last, so such a file would mean one model here and another there. */
#ifndef M2D_JSON_H
#define M2D_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Parse TEXT[0, LEN) of PATH into *OUT (free with cJSON_Delete). -1 with one line naming PATH and
 * a field when: the JSON is malformed ("PATH: field 'ROOT': malformed JSON near byte N of LEN";
 * ROOT names the document, e.g. "(root)" or "header"), anything but whitespace follows the value,
 * or an object anywhere holds a key twice ("PATH: field 'rope_scaling': duplicate key 'factor'";
 * the object is named by its keys from the top, [i] for an array element, ROOT for the top). */
int m2d_json_parse(const char *path, const char *root, const char *text, size_t len, cJSON **out);

#endif
