package hostfs

// SetAfterResolve makes f call hook between resolving a path and acting on it (tests only).
func SetAfterResolve(f *FS, hook func(hostPath string)) { f.afterResolve = hook }
