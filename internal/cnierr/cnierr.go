// Package cnierr builds the CNI error objects every meshwire plugin returns.
//
// The CNI spec reserves a few well-known codes; meshwire uses them so that a
// runtime (and the person reading its log) can tell a bad config from a
// transient failure without parsing messages. Each helper names the field or
// object at fault in the message.
package cnierr

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/types"
)

// Well-known codes of the CNI spec, re-exported so callers need one import.
const (
	CodeIncompatibleVersion = types.ErrIncompatibleCNIVersion      // 1
	CodeUnsupportedField    = types.ErrUnsupportedField            // 2
	CodeUnknownContainer    = types.ErrUnknownContainer            // 3
	CodeInvalidEnv          = types.ErrInvalidEnvironmentVariables // 4
	CodeIOFailure           = types.ErrIOFailure                   // 5
	CodeDecoding            = types.ErrDecodingFailure             // 6
	CodeInvalidConfig       = types.ErrInvalidNetworkConfig        // 7
	CodeInvalidNetNS        = types.ErrInvalidNetNS                // 8
	CodeTryAgainLater       = types.ErrTryAgainLater               // 11
	CodeNotAvailable        = types.ErrPluginNotAvailable          // 50
	CodeLimitedConnectivity = types.ErrLimitedConnectivity         // 51
	CodeInternal            = types.ErrInternal                    // 999
)

func newf(code uint, format string, a ...any) *types.Error {
	return types.NewError(code, fmt.Sprintf(format, a...), "")
}

// InvalidEnv reports a missing or malformed CNI_* environment variable (code 4).
func InvalidEnv(variable, format string, a ...any) *types.Error {
	return newf(CodeInvalidEnv, "%s: %s", variable, fmt.Sprintf(format, a...))
}

// Decoding reports input that is not decodable at all (code 6).
func Decoding(format string, a ...any) *types.Error {
	return newf(CodeDecoding, format, a...)
}

// Field reports a config field with a bad value (code 7). field is the JSON
// path as the user wrote it, e.g. "ipam.ranges[0][1].subnet".
func Field(field, format string, a ...any) *types.Error {
	return newf(CodeInvalidConfig, "invalid config: %s: %s", field, fmt.Sprintf(format, a...))
}

// Config reports a config problem that is not about one field (code 7), such
// as two options that contradict each other.
func Config(format string, a ...any) *types.Error {
	return newf(CodeInvalidConfig, "invalid config: %s", fmt.Sprintf(format, a...))
}

// TryAgain reports a transient condition, typically a lock that could not be
// taken in time (code 11). The runtime is expected to retry.
func TryAgain(format string, a ...any) *types.Error {
	return newf(CodeTryAgainLater, format, a...)
}

// NotAvailable is the STATUS answer of a plugin that cannot serve ADD (code 50).
func NotAvailable(format string, a ...any) *types.Error {
	return newf(CodeNotAvailable, format, a...)
}

// Internal wraps an unexpected failure (code 999) keeping its message.
func Internal(format string, a ...any) *types.Error {
	return newf(CodeInternal, format, a...)
}

// Code returns the CNI code carried by err, CodeInternal for a plain error and
// 0 for nil.
func Code(err error) uint {
	if err == nil {
		return 0
	}
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// Wrap keeps a CNI error as it is (adding context to its message) and turns
// any other error into an internal one, so that the code chosen where the
// problem was found survives the trip up the stack.
func Wrap(err error, format string, a ...any) error {
	if err == nil {
		return nil
	}
	ctx := fmt.Sprintf(format, a...)
	var e *types.Error
	if errors.As(err, &e) {
		return types.NewError(e.Code, ctx+": "+e.Msg, e.Details)
	}
	return types.NewError(CodeInternal, ctx+": "+err.Error(), "")
}

// CheckFailed reports that CHECK found the container's networking not in the
// state ADD left it in. The spec gives this no code of its own; like the
// reference plugins, meshwire uses the generic one (999).
func CheckFailed(format string, a ...any) *types.Error {
	return newf(CodeInternal, "check failed: %s", fmt.Sprintf(format, a...))
}

// Catch runs fn and turns a panic in it into an internal error (code 999),
// logged with its stack as a "panic" record (the node agent counts those).
// The plugin frame recovers a panic of the main goroutine; every goroutine
// a plugin starts runs its work through Catch, so that no input ends in a
// Go stack trace instead of a CNI error.
func Catch(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			slog.Error("panic", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = Internal("internal error: %v", r)
		}
	}()
	return fn()
}
